"""Cost of authentication and authorization.

Phases:
  mechanisms  server-side PLAIN verification and a full SCRAM-SHA-256 exchange, in-process
              (PBKDF2-HMAC-SHA256 with the credentials file's iteration count dominates both)
  authorize   the per-request ACL check with 10 / 100 / 1000 entries: a plain list, and AclIndex
              (what the servers use)
  connect     a new connection to a one-node SASL_SSL quorum: TCP + TLS + SASL + one DescribeAcls
  raft-attack a local three-node quorum's leader, its Raft port attacked by processes without the cluster
              secret (messages announced at 2 GiB and streamed at full speed, a connection flood, slowloris)
              while allocations run: elections, allocation p50/p99, the leader's CPU and memory, against
              the same run without the attack and with the same attackers aimed at a plain listener beside
              it (the control: what the attacking processes cost the machine, not the node)

Run: pidctl bench security [--quick] [--json bench-results/security.json]
(``python -m benchmarks.security`` takes the same options.)
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import struct
import sys
import tempfile
import time

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.security import acl
from quorum.security import credentials
from quorum.security.client import ClientSecurity
from quorum.security.mechanisms import PlainServer, ScramClient, ScramServer

from .common import percentile
from .harness import environment_info, log, parser, utc_now, write_json
from .pki import make_pki


def _ms_stats(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"n": len(s), "median_ms": round(statistics.median(s) * 1000, 3),
            "p99_ms": round(percentile(s, 99) * 1000, 3), "max_ms": round(s[-1] * 1000, 3)}


def phase_mechanisms(args, tmp: str) -> dict:
    path = os.path.join(tmp, "users.json")
    credentials.add_user(path, "alice", "alice-pw", iterations=args.iterations)
    creds = credentials.load(path)
    plain, scram = [], []
    for _ in range(args.auths):
        t = time.perf_counter()
        PlainServer(creds).step(b"\0alice\0alice-pw")
        plain.append(time.perf_counter() - t)
        client, server = ScramClient("alice", "alice-pw"), ScramServer(creds)
        t = time.perf_counter()
        first = server.step(client.first())
        final = client.final(first)  # the client's PBKDF2 is timed too: a full exchange in one process
        server.step(final)
        scram.append(time.perf_counter() - t)
    return {"iterations": args.iterations, "plain_verify": _ms_stats(plain),
            "scram_exchange_incl_client": _ms_stats(scram)}


def phase_authorize(args, tmp: str) -> dict:
    out = {}
    for n in (10, 100, 1000):
        acls = [acl.Acl(f"User:u{i}", acl.TRANSACTIONAL_ID, f"tx-{i}-", acl.PREFIXED, acl.WRITE, acl.ALLOW) for i in range(n)]
        acls.append(acl.Acl("User:alice", acl.CLUSTER, acl.CLUSTER_NAME, acl.LITERAL, acl.IDEMPOTENT_WRITE, acl.ALLOW))
        calls = args.calls
        t = time.perf_counter()
        for _ in range(calls):
            acl.authorize(acls, "User:alice", acl.CLUSTER, acl.CLUSTER_NAME, acl.IDEMPOTENT_WRITE, (), "127.0.0.1")
        out[f"list_{n}_entries_us_per_call"] = round((time.perf_counter() - t) / calls * 1e6, 2)
        index = acl.AclIndex(acls)  # what the servers use: only the principal's and User:*'s entries are read
        t = time.perf_counter()
        for _ in range(calls):
            index.authorize("User:alice", acl.CLUSTER, acl.CLUSTER_NAME, acl.IDEMPOTENT_WRITE, (), "127.0.0.1")
        out[f"index_{n}_entries_us_per_call"] = round((time.perf_counter() - t) / calls * 1e6, 2)
    return out


def phase_connect(args, tmp: str) -> dict:
    pki = make_pki(os.path.join(tmp, "pki"))
    users = os.path.join(tmp, "users.json")
    credentials.add_user(users, "admin", "admin-pw", iterations=args.iterations)
    lc = LocalCluster(os.path.join(tmp, "cluster"))
    lc.up(1, sasl_credentials_file=users, super_users=["User:admin"], tls_certfile=pki.certfile,
          tls_keyfile=pki.keyfile, tls_cafile=pki.cafile)
    try:
        out = {}
        for mech in ("PLAIN", "SCRAM-SHA-256"):
            sec = ClientSecurity("SASL_SSL", mech, "admin", "admin-pw", pki.cafile)

            async def one():
                c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=10), security=sec)
                t = time.perf_counter()
                try:
                    await c.describe_acls()
                    return time.perf_counter() - t
                finally:
                    await c.close()

            async def go():
                await one()  # leader election, warm-up
                return [await one() for _ in range(args.connects)]
            out[mech] = _ms_stats(asyncio.run(go()))
        return out
    finally:
        lc.down(timeout=5)


# ---------------------------------------------------------------- raft-attack
def _attack(kind: str, host: str, port: int, seconds: float, results) -> None:
    """One attacker process (no cluster secret): ``kind`` at full speed for ``seconds``."""
    end, sent, connects, failed = time.monotonic() + seconds, 0, 0, 0
    held: list[socket.socket] = []
    chunk = b"\xab" * 65536
    while time.monotonic() < end:
        try:
            s = socket.create_connection((host, port), timeout=1.0)
        except OSError:
            failed += 1
            continue
        connects += 1
        try:
            if kind == "stream":  # a message announced at 2 GiB, then bytes until the node closes the link
                s.sendall(struct.pack("i", 0x7FFFFFFF))
                while time.monotonic() < end:
                    sent += s.send(chunk)
                s.close()
            elif kind == "flood":  # connections opened as fast as the node takes them, 500 held at once
                held.append(s)
                if len(held) > 500:
                    held.pop(0).close()
            elif kind == "slowloris":  # 200 connections, each sending a byte of a message per second
                s.setblocking(False)
                held.append(s)
                if len(held) >= 200:
                    while time.monotonic() < end:
                        for h in list(held):
                            try:
                                h.send(b"\x01")
                            except OSError:
                                held.remove(h)
                        time.sleep(1.0)
                        if len(held) < 200:
                            break
        except OSError:
            s.close()
    for h in held:
        h.close()
    results.put({"kind": kind, "connects": connects, "connect_failures": failed, "bytes_streamed": sent})


def _sink(host: str, ready, seconds: float) -> None:
    """The control: a listener that takes what the attackers send and closes each connection after its first
    read (about what the node does with them), in a process of its own, so that the allocations measured beside
    it pay the attackers' share of the machine but none of the node's work for them."""
    srv = socket.create_server((host, 0), backlog=1024)
    srv.setblocking(False)
    ready.put(srv.getsockname()[1])
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in sel.select(0.2):
            if key.fileobj is srv:
                for _ in range(32):
                    try:
                        conn, _ = srv.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ)
            else:
                try:
                    key.fileobj.recv(65536)
                except OSError:
                    pass
                sel.unregister(key.fileobj)
                key.fileobj.close()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _allocations(lc: LocalCluster, seconds: float, leader_pid: int) -> dict:
    c = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=10))
    try:
        addr, before = await c.find_leader()
        epoch = await c.register_broker(1)
        lat, rss, t_end = [], [], time.monotonic() + seconds
        next_rss, cpu0, t0 = 0.0, _cpu_s(leader_pid), time.monotonic()
        while time.monotonic() < t_end:
            t = time.perf_counter()
            await c.allocate(1, epoch)
            lat.append(time.perf_counter() - t)
            if time.monotonic() >= next_rss:
                rss.append(_rss_mb(leader_pid))
                next_rss = time.monotonic() + 0.5
        cpu = (_cpu_s(leader_pid) - cpu0) / (time.monotonic() - t0)
        addr_after, after = await c.find_leader()
        return {"allocations": len(lat), "per_s": round(len(lat) / seconds, 1), **_ms_stats(lat),
                "leader_cpu_share": round(cpu, 3), "leader_cpu_ms_per_allocation": round(cpu * seconds * 1000
                                                                                       / max(1, len(lat)), 3), "terms_passed": after["raft"]["term"] - before["raft"]["term"],
                "leader_changed": addr_after != addr, "leader_rss_mb_max": round(max(rss), 1),
                "leader_rss_mb_first": round(rss[0], 1)}
    finally:
        await c.close()


def phase_raft_attack(args, tmp: str) -> dict:
    lc = LocalCluster(os.path.join(tmp, "attacked"))
    lc.up(3)
    try:
        probe = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=10))
        leader_client = asyncio.run(_leader(probe))
        leader = next(n for n in lc.nodes() if n.client_address == leader_client)
        host, port = leader.raft_address.rsplit(":", 1)
        out = {"none": asyncio.run(_allocations(lc, args.attack_seconds, leader.pid))}
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Queue()
        sink = ctx.Process(target=_sink, args=(host, ready, args.attack_seconds + 5))
        sink.start()
        sink_port = ready.get(timeout=30)
        try:
            # The control: the same attackers on the same machine, aimed at the sink instead of the node.
            out["attack_on_control"], _ = _attacked(ctx, lc, args, leader.pid, host, sink_port)
        finally:
            sink.join(10)
            if sink.is_alive():
                sink.kill()
        out["attack"], out["attackers"] = _attacked(ctx, lc, args, leader.pid, host, int(port))
        out["leader_rss_mb_after"] = round(_rss_mb(leader.pid), 1)
        return out
    finally:
        lc.down(timeout=5)


def _attacked(ctx, lc: LocalCluster, args, leader_pid: int, host: str, port: int) -> tuple[dict, list]:
    """Allocations measured while the attackers run against ``host:port``; their own figures."""
    results = ctx.Queue()
    kinds = ["stream"] * args.streamers + ["flood", "slowloris"]
    procs = [ctx.Process(target=_attack, args=(k, host, port, args.attack_seconds + 2, results)) for k in kinds]
    for proc in procs:
        proc.start()
    try:
        time.sleep(1.0)  # the attack under way before the measurement starts
        measured = asyncio.run(_allocations(lc, args.attack_seconds, leader_pid))
        return measured, [results.get(timeout=30) for _ in procs]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


async def _leader(c: QuorumClient) -> str:
    try:
        return (await c.find_leader())[0]
    finally:
        await c.close()


def main(argv=None, prog: str | None = None) -> int:
    ap = parser(prog, __doc__, raw=False)
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--json", default="bench-results/security.json")
    ap.add_argument("--iterations", type=int, default=credentials.DEFAULT_ITERATIONS)
    ap.add_argument("--phases", default="mechanisms,authorize,connect,raft-attack")
    ap.add_argument("--attack-seconds", type=float, default=None, help="raft-attack: seconds per run (20; quick 8)")
    ap.add_argument("--streamers", type=int, default=4, help="raft-attack: processes streaming 2 GiB messages")
    args = ap.parse_args(argv)
    args.auths = 50 if args.quick else 300
    args.calls = 20_000 if args.quick else 100_000
    args.connects = 20 if args.quick else 100
    args.attack_seconds = args.attack_seconds or (8.0 if args.quick else 20.0)
    res = {"params": {k: v for k, v in vars(args).items()}, "environment": environment_info(),
           "started_at": utc_now(), "phases": {}}
    fns = {"mechanisms": phase_mechanisms, "authorize": phase_authorize, "connect": phase_connect,
           "raft-attack": phase_raft_attack}
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        for name in [p.strip() for p in args.phases.split(",") if p.strip()]:
            log(f"phase {name}")
            res["phases"][name] = fns[name](args, tmp)
            print(f"{name}: {json.dumps(res['phases'][name])}")
    write_json(res, args.json)
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
