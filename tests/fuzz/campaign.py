"""A longer fuzz campaign over every decoder and both servers (not a test: pytest does not collect it).

Run from the repository root (a Python with pidquorum and its test extras)::

    python -m tests.fuzz.campaign --seconds 600 [--server-share 0.4] [--seed 1]
                                  [--json bench-results/fuzz.json] [--out bench-results/fuzz]

Two phases, one after the other, sharing ``--seconds``:

1. In-process decoders (``1 - server_share`` of the time), in a child process
   under ``nice`` and an address-space limit (in use + 2 GiB, as the fuzz tests), so a native abort
   or runaway allocation is caught rather than taking the campaign down.  Targets,
   round-robin in batches: the quorum's and the broker's request decoders (every
   API and version of their tables, valid and corrupted frames, the msgpack APIs),
   the record decoder (records.codec), and the file decoders (snapshot, journal,
   journal meta, audit trail, audit checkpoint, chaos history, chaos final state).
   Inputs and the decoder properties come from ``tests/fuzz/inputs.py``, as for the fuzz tests; input ``i`` of a batch is drawn from
   ``random.Random(f"{seed}:{target}:{batch}:{i}")``, so every finding is
   reproducible from the numbers in the JSON, and its bytes are saved as well.
2. Servers (``server_share`` of the time): a fresh three-node LocalCluster and one
   ``python -m broker`` (``benchmarks.processes.BrokerProcess``), on free loopback ports.  Rounds of garbage (500 inputs
   per server per round, over many connections, ``tests/fuzz/servers.py``); after
   each round every process must be alive, every input answered or its connection
   closed as the decoder predicts, and the quorum's replicated state (summary and
   commit index) unchanged.  At the end a control allocation, InitProducerId and
   Produce must succeed, and the logs are searched for tracebacks.

Writes JSON: inputs per target, outcomes per target (the documented errors by
kind), findings (target, problem, exception type, reproduction, saved input) and
unexpected exceptions by type; prints a table.  Exit status 0 with no findings, 1 with.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import multiprocessing as mp
import os
import random
import resource
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict

from benchmarks.common import log
from benchmarks.processes import BrokerProcess
from quorum.client.quorum import Connection, QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from tests.fuzz import inputs as F
from tests.fuzz import servers as S
from records.wire import kafka

BATCH = 200
# ------------------------------------------------------------------ phase 1: in-process

def _draw_record_bytes(src):
    obj, how = F.record_obj(src)
    data = F.msgpack.packb(obj, use_bin_type=True) if F._packable(obj) else src.binary(40)
    return F.mutate_bytes(data, src) if src.boolean(0.6) else data, how


# target: (draw one input from a RandomSource, check the decoder on it); then the file decoders, by kind
DECODERS = {
    "quorum-requests": (lambda src: F.fuzz_frame("quorum", src), lambda v: F.check_request_decoder("quorum", v)),
    "broker-requests": (lambda src: F.fuzz_frame("broker", src), lambda v: F.check_request_decoder("broker", v)),
    "msgpack-requests": (lambda src: F.msgpack_request(src), lambda v: F.check_request_decoder("quorum", v)),
    "records": (lambda src: F.record_obj(src), lambda v: F.check_record_obj(v)),
    "record-bytes": (_draw_record_bytes, lambda v: F.check_record_decoder(v)),
}
TARGETS = tuple(DECODERS) + tuple(f"file:{k}" for k in F.FILE_KINDS)


def draw(target: str, src):
    """One input for ``target``: (what is checked, description)."""
    if target in DECODERS:
        return DECODERS[target][0](src)
    kind = target.split(":", 1)[1]
    data, original, how = F.file_input(kind, src)
    return (data, original), how


def check(target: str, value, workdir: str) -> str:
    if target in DECODERS:
        return DECODERS[target][1](value)
    data, original = value
    return F.check_file_decoder(target.split(":", 1)[1], data, original, workdir)


def as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, tuple):
        return value[0]
    return F.msgpack.packb(value, use_bin_type=True) if F._packable(value) else repr(value).encode()


def input_rng(seed: int, target: str, batch: int, i: int) -> random.Random:
    return random.Random(f"{seed}:{target}:{batch}:{i}")


def _child(conn, current, seed: int) -> None:
    """Run batches sent by the parent; report (counts, findings) per batch."""
    os.nice(10)
    logging.disable(logging.CRITICAL)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (F.vm_size() + F.HEADROOM, hard))
    workdir = tempfile.mkdtemp(prefix="pidquorum-fuzz-files-")
    while True:
        job = conn.recv()
        if job is None:
            return
        target, batch = job
        outcomes: Counter = Counter()
        findings = []
        for i in range(BATCH):
            current.value = i
            src = F.RandomSource(input_rng(seed, target, batch, i))
            value, how = draw(target, src)
            try:
                outcomes[check(target, value, workdir)] += 1
            except F.FuzzFinding as e:
                cause = e.__cause__
                findings.append({"target": target, "batch": batch, "index": i, "how": how, "problem": e.problem,
                                 "exception": type(cause).__name__ if cause is not None else "FuzzFinding",
                                 "input_hex": as_bytes(value).hex()})
            except Exception as e:  # noqa: BLE001 - the generator or the check itself broke: report it
                findings.append({"target": target, "batch": batch, "index": i, "how": how,
                                 "problem": f"harness error: {traceback.format_exc(limit=3)}",
                                 "exception": type(e).__name__, "input_hex": ""})
        conn.send((outcomes, findings))


def run_decoders(seconds: float, seed: int, out_dir: str) -> dict:
    ctx = mp.get_context("fork")
    counts: Counter = Counter()
    outcomes: dict[str, Counter] = defaultdict(Counter)
    findings: list[dict] = []
    crashes: list[dict] = []

    def start():
        parent, child = ctx.Pipe()
        current = ctx.Value("i", -1, lock=False)
        proc = ctx.Process(target=_child, args=(child, current, seed), daemon=True)
        proc.start()
        return proc, parent, current

    proc, conn, current = start()
    deadline = time.monotonic() + seconds
    batch = 0
    last_log = time.monotonic()
    try:
        while time.monotonic() < deadline:
            for target in TARGETS:
                if time.monotonic() >= deadline:
                    break
                conn.send((target, batch))
                while not conn.poll(1.0):
                    if not proc.is_alive():
                        break
                try:
                    got, found = conn.recv() if conn.poll(0) else (None, None)
                except (EOFError, OSError):  # the child died: its end of the pipe is closed
                    got = None
                if got is not None:
                    counts[target] += BATCH
                    outcomes[target].update(got)
                    findings.extend(found)
                    continue
                proc.join(5)
                # the child died on input `current` of this batch: a crash (abort, memory limit ...)
                i = current.value
                value, how = draw(target, F.RandomSource(input_rng(seed, target, batch, i)))
                path = os.path.join(out_dir, f"crash-{target.replace(':', '-')}-{batch}-{i}.bin")
                with open(path, "wb") as f:
                    f.write(as_bytes(value))
                crashes.append({"target": target, "batch": batch, "index": i, "how": how,
                                "exitcode": proc.exitcode, "input_file": path})
                counts[target] += i + 1
                log(f"CRASH: {target} batch {batch} input {i} (exit code {proc.exitcode}); saved {path}")
                proc, conn, current = start()
            batch += 1
            if time.monotonic() - last_log > 30:
                last_log = time.monotonic()
                log(f"decoders: {sum(counts.values())} inputs, {len(findings)} findings, {len(crashes)} crashes")
    finally:
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    for n, fnd in enumerate(findings):
        path = os.path.join(out_dir, f"finding-{n}-{fnd['target'].replace(':', '-')}.bin")
        with open(path, "wb") as f:
            f.write(bytes.fromhex(fnd["input_hex"]))
        fnd["input_file"] = path
    return {"inputs": dict(counts), "outcomes": {k: dict(v) for k, v in outcomes.items()},
            "findings": findings, "crashes": crashes}


# ------------------------------------------------------------------ phase 2: servers

def run_servers(seconds: float, seed: int, out_dir: str) -> dict:
    control = 4242
    result: dict = {"inputs": Counter(), "outcomes": Counter(), "drawn": Counter(), "rounds": 0,
                    "violations": [], "tracebacks": {}}
    base = tempfile.mkdtemp(prefix="pidquorum-fuzz-servers-")
    lc = LocalCluster(os.path.join(base, "cluster"))
    broker = None
    try:
        lc.up(3)

        async def describe_leader():
            c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=5.0, attempt_timeout=1.0))
            try:
                for _ in range(200):
                    for a in lc.client_addresses():
                        try:
                            d = await c.describe(a)
                        except Exception:  # noqa: BLE001 - starting or electing
                            continue
                        if d["raft"]["state"] == "leader":
                            return d
                    await asyncio.sleep(0.1)
                raise RuntimeError("no leader")
            finally:
                await c.close()

        async def control_register():
            c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=20.0, attempt_timeout=3.0))
            try:
                epoch = await c.register_broker(control)
                await c.allocate(control, epoch)
                return epoch
            finally:
                await c.close()
        epoch = asyncio.run(control_register())
        broker = BrokerProcess(base, 1, lc.client_addresses(), "--partitions", "2").start()

        def stable_state():
            seen = []
            for _ in range(60):
                seen.append(S.replicated_state(asyncio.run(describe_leader())))
                if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]:
                    return seen[-1]
                time.sleep(0.5)  # polling for the broker's start-up allocations to settle
            raise RuntimeError("quorum state does not settle")
        before = stable_state()
        src = F.RandomSource(random.Random(seed))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            result["rounds"] += 1
            for server in ("quorum", "broker"):
                inputs, drawn = S.make_inputs(server, src, 500, {control} if server == "quorum" else set())
                result["drawn"].update({f"{server}:{k}": v for k, v in drawn.items()})
                addresses = lc.client_addresses() if server == "quorum" else [broker.bootstrap]

                async def fuzz():
                    chunks = [inputs[i::len(addresses)] for i in range(len(addresses))]
                    total = Counter()
                    for r in await asyncio.gather(*(S.blast(a, c, connections=8 // len(addresses) + 1)
                                                    for a, c in zip(addresses, chunks))):
                        total.update(r)
                    return total
                counts = asyncio.run(fuzz())
                result["inputs"][server] += len(inputs)
                result["outcomes"].update({f"{server}:{k}": v for k, v in counts.items()})
                for k, v in S.problems(counts).items():
                    result["violations"].append(f"round {result['rounds']} {server}: {k} x{v}")
                dead = [n.node_id for n in lc.nodes() if not lc.alive(n.node_id)]
                if dead or broker.proc.poll() is not None:
                    result["violations"].append(f"round {result['rounds']} {server}: dead: nodes {dead}, "
                                                f"broker exit {broker.proc.poll()}")
                    raise RuntimeError("a process died")
                now = S.replicated_state(asyncio.run(describe_leader()))
                if now["state"] != before["state"]:  # (a broker's heartbeats move the commit index)
                    result["violations"].append(f"round {result['rounds']} {server}: state moved: {before} -> {now}")
                    before = now
            if result["rounds"] % 5 == 0:
                log(f"servers: round {result['rounds']}, {dict(result['inputs'])} inputs, "
                    f"{len(result['violations'])} violations")

        async def control_after():
            c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=20.0, attempt_timeout=3.0))
            try:
                blk = await c.allocate(control, epoch)
            finally:
                await c.close()
            conn = Connection(broker.bootstrap, "fuzz-campaign")
            try:
                resp = await conn.call(kafka.request_entity(22, 4, transactional_id=None,
                                                        transaction_timeout=datetime.timedelta(seconds=60),
                                                            producer_id=-1, producer_epoch=-1), 10.0)
            finally:
                conn.close()
            return blk, int(resp.error_code), int(resp.producer_id)
        blk, code, pid = asyncio.run(control_after())
        result["control"] = {"allocation_start": blk.start, "expected_start": before["state"]["next_producer_id"],
                             "init_producer_id_error": code, "producer_id": pid}
        if blk.start != before["state"]["next_producer_id"] or code != 0 or pid < 0:
            result["violations"].append(f"control requests after the campaign: {result['control']}")
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        result["violations"].append(f"campaign aborted: {type(e).__name__}: {e}")
    finally:
        logs = {f"node-{n.node_id}": lc.tail_log(n.node_id, 10**6) for n in lc.nodes()}
        if broker is not None:
            logs["broker"] = broker.tail(10**6)
            broker.stop()
        lc.down(timeout=5)
        for name, text in logs.items():
            result["tracebacks"][name] = text.count("Traceback")
            if "Traceback" in text:
                with open(os.path.join(out_dir, f"{name}.log"), "w") as f:
                    f.write(text)
    result["inputs"], result["outcomes"], result["drawn"] = (dict(result["inputs"]), dict(result["outcomes"]),
                                                              dict(result["drawn"]))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--server-share", type=float, default=0.4, help="share of the time spent on the servers")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="bench-results/fuzz.json")
    ap.add_argument("--out", default="bench-results/fuzz", help="where crashing inputs are saved")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    os.nice(5)
    started = time.time()
    log(f"decoders for {args.seconds * (1 - args.server_share):.0f}s")
    dec = run_decoders(args.seconds * (1 - args.server_share), args.seed, args.out)
    log(f"servers for {args.seconds * args.server_share:.0f}s")
    srv = run_servers(args.seconds * args.server_share, args.seed, args.out) if args.server_share > 0 else {}
    by_type = Counter(f["exception"] for f in dec["findings"])
    report = {
        "seed": args.seed, "seconds": args.seconds, "started_at": started, "elapsed_s": round(time.time() - started, 1),
        "decoders": dec, "servers": srv,
        "totals": {"decoder_inputs": sum(dec["inputs"].values()),
                   "server_inputs": sum(srv.get("inputs", {}).values()),
                   "findings": len(dec["findings"]), "crashes": len(dec["crashes"]),
                   "server_violations": len(srv.get("violations", [])),
                   "server_tracebacks": sum(srv.get("tracebacks", {}).values()),
                   "unexpected_exceptions_by_type": dict(by_type)},
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"{'target':<22}{'inputs':>10}  outcomes")
    for t in TARGETS:
        oc = ", ".join(f"{k}={v}" for k, v in sorted(dec["outcomes"].get(t, {}).items()))
        print(f"{t:<22}{dec['inputs'].get(t, 0):>10}  {oc}")
    for s, n in srv.get("inputs", {}).items():
        print(f"{'server:' + s:<22}{n:>10}  rounds={srv['rounds']}")
    print(json.dumps(report["totals"], indent=2))
    for fnd in dec["findings"][:20]:
        print(f"FINDING {fnd['target']}: {fnd['problem'][:200]} ({fnd['input_file']})")
    for c in dec["crashes"]:
        print(f"CRASH {c}")
    for v in srv.get("violations", []):
        print(f"VIOLATION {v}")
    log(f"wrote {args.json}")
    bad = dec["findings"] or dec["crashes"] or srv.get("violations") or sum(srv.get("tracebacks", {}).values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
