"""One benchmark broker of ``pidctl bench`` (``benchmarks.run``), in a process of its own: it connects to
the system under test, warms up, prints READY, waits for ``GO <start> <stop>`` on stdin, allocates
blocks back to back (or, ``--mode manager``, runs a ProducerIdManager at a paced rate) and writes its
record to ``--out`` as JSON.  The allocators and the protocol: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import base64
import http.client
import json
import sys
import time

from broker.pid_manager import ProducerIdManager
from quorum.client.quorum import QuorumClient, RetryPolicy
from records.wire.errors import CoordinatorLoadInProgressError

from .common import paced

BLOCK = 1000
ATTEMPT_TIMEOUT_S = 1.0


class Record:
    def __init__(self):
        self.t0 = array.array("d")
        self.t1 = array.array("d")
        self.start = array.array("q")
        self.length = array.array("q")
        self.retries = array.array("q")
        self.errors: dict[str, int] = {}

    def add(self, t0, t1, start, length, retries):
        self.t0.append(t0)
        self.t1.append(t1)
        self.start.append(start)
        self.length.append(length)
        self.retries.append(retries)

    def error(self, e: BaseException):
        k = type(e).__name__
        self.errors[k] = self.errors.get(k, 0) + 1

    def to_dict(self) -> dict:
        return {"t0": self.t0.tolist(), "t1": self.t1.tolist(), "start": self.start.tolist(),
                "length": self.length.tolist(), "retries": self.retries.tolist(), "errors": self.errors}


def handshake() -> tuple[float, float]:
    print("READY", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 3 or line[0] != "GO":
        raise SystemExit(f"worker: expected 'GO <start> <stop>', got {line!r}")
    return float(line[1]), float(line[2])


def wait_until(t: float) -> None:
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


# ------------------------------------------------------------------ ZooKeeper
class ZkAllocator:
    def __init__(self, endpoints: str, broker_id: int):
        from quorum.migration.zk import LegacyAllocator, connect  # heavy (kazoo): imported when used
        self.zk = connect(endpoints, timeout=10.0)
        self.alloc = LegacyAllocator(self.zk, broker_id, BLOCK, timeout=60.0, op_timeout=ATTEMPT_TIMEOUT_S)

    def allocate(self) -> tuple[int, int, int]:
        before = self.alloc.retries
        start, length = self.alloc.allocate()
        return start, length, self.alloc.retries - before

    def close(self):
        self.zk.stop()
        self.zk.close()


# ------------------------------------------------------------------ etcd
KEY = "/latest_producer_id_block"


class EtcdAllocator:
    def __init__(self, endpoints: str, broker_id: int):
        self.b64 = lambda b: base64.b64encode(b).decode()
        self.unb64 = base64.b64decode
        self.endpoints = endpoints.split(",")
        self.broker_id = broker_id
        self.which = broker_id % len(self.endpoints)
        self.conn: http.client.HTTPConnection | None = None
        self.key = self.b64(KEY.encode())

    def _post(self, path: str, body: dict) -> dict:
        if self.conn is None:
            host, port = self.endpoints[self.which].rsplit(":", 1)
            self.conn = http.client.HTTPConnection(host, int(port), timeout=ATTEMPT_TIMEOUT_S)
        try:
            self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            self._next()
            raise
        if resp.status != 200:
            self._next()
            raise ConnectionError(f"HTTP {resp.status}: {data[:120]!r}")
        return json.loads(data)

    def _next(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.which = (self.which + 1) % len(self.endpoints)

    def _read(self) -> tuple[bytes | None, int]:
        kvs = self._post("/v3/kv/range", {"key": self.key}).get("kvs") or []
        if not kvs:
            return None, 0
        return self.unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"])

    def _value(self, start: int) -> bytes:
        return json.dumps({"version": 1, "broker": self.broker_id, "block_start": str(start),
                           "block_end": str(start + BLOCK - 1)}, separators=(",", ":")).encode()

    def allocate(self) -> tuple[int, int, int]:
        retries = 0
        pending: bytes | None = None
        deadline = time.monotonic() + 60.0
        current = None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("no conclusive etcd Txn within 60 s")
            try:
                if current is None:
                    current = self._read()
                value, rev = current
                if pending is not None and value == pending:
                    return int(json.loads(value)["block_start"]), BLOCK, retries
                pending = None
                start = 0 if value is None else int(json.loads(value)["block_end"]) + 1
                new = self._value(start)
                txn = {"compare": [{"key": self.key, "target": "MOD", "result": "EQUAL", "mod_revision": str(rev)}],
                       "success": [{"request_put": {"key": self.key, "value": self.b64(new)}}],
                       "failure": [{"request_range": {"key": self.key}}]}
                try:
                    resp = self._post("/v3/kv/txn", txn)
                except (OSError, http.client.HTTPException):
                    pending, current = new, None  # outcome unknown: re-read, and claim it if it is ours
                    retries += 1
                    continue
                if resp.get("succeeded"):
                    return start, BLOCK, retries
                retries += 1  # lost the race: the failure branch holds the new value
                kvs = resp["responses"][0]["response_range"].get("kvs") or []
                current = (None, 0) if not kvs else (self.unb64(kvs[0].get("value", "")),
                                                       int(kvs[0]["mod_revision"]))
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                current = None
                retries += 1
                time.sleep(0.01)

    def close(self):
        if self.conn is not None:
            self.conn.close()


async def timed_loop(allocate, stop: float, rec: Record) -> None:
    """``await allocate()`` back to back until ``stop`` (``time.monotonic``): each call's start and end,
    block and retries into ``rec``; a call that raises is counted and the loop goes on."""
    mono = time.monotonic
    while True:
        t0 = mono()
        if t0 >= stop:
            break
        try:
            s, n, r = await allocate()
        except Exception as e:  # noqa: BLE001 - counted, the run goes on
            rec.error(e)
            continue
        rec.add(t0, mono(), s, n, r)


def run_sync(alloc, warmup: int) -> Record:
    """A blocking allocator (ZooKeeper, etcd) through ``timed_loop``, in an event loop of its own."""
    async def allocate():
        return alloc.allocate()

    async def run() -> Record:
        rec = Record()
        for _ in range(warmup):
            alloc.allocate()
        start, stop = handshake()
        wait_until(start)
        await timed_loop(allocate, stop, rec)
        return rec
    return asyncio.run(run())


# ------------------------------------------------------------------ pidquorum
def policy():
    return RetryPolicy(timeout=60.0, attempt_timeout=ATTEMPT_TIMEOUT_S)


async def run_pidquorum(endpoints: str, broker_id: int, warmup: int) -> Record:
    c = QuorumClient(endpoints.split(","), policy(), client_id=f"bench-{broker_id}", prefer_leader=True)
    rec = Record()
    try:
        epoch = await c.register_broker(broker_id)
        for _ in range(warmup):
            await c.allocate(broker_id, epoch)
        start, stop = await asyncio.to_thread(handshake)
        await asyncio.sleep(max(0.0, start - time.monotonic()))

        async def allocate():
            b = await c.allocate(broker_id, epoch)
            return b.start, b.length, 0
        await timed_loop(allocate, stop, rec)
    finally:
        await c.close()
    return rec


async def run_manager(endpoints: str, broker_id: int, rate: float) -> dict:
    """A broker's ProducerIdManager on the real quorum; generate_producer_id() paced at ``rate`` IDs/s."""
    c = QuorumClient(endpoints.split(","), policy(), client_id=f"bench-manager-{broker_id}", prefer_leader=True)
    mgr = ProducerIdManager(broker_id, c)
    await mgr.start()
    ns = time.perf_counter_ns
    gen = mgr.generate_producer_id
    lat = array.array("q")
    refusals = 0
    refused_at: list[float] = []
    dry_since = None
    max_dry = 0.0
    last = -1
    ordered = True
    ids = 0
    tick = 0.01
    try:
        # Warm-up: the demand estimate and the reserve settle (2 s at the rate, not recorded).
        warm_end = time.monotonic() + 2.0
        owed_base = time.monotonic()
        issued = 0
        while time.monotonic() < warm_end:
            await asyncio.sleep(tick)
            owed = int((time.monotonic() - owed_base) * rate) - issued
            for _ in range(owed):
                try:
                    gen()
                    issued += 1
                except CoordinatorLoadInProgressError:
                    break
        start, stop = await asyncio.to_thread(handshake)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        async for _, now in paced(start, tick):
            if now >= stop:
                break
            owed = int((now - start) * rate) - ids
            for _ in range(owed):
                t0 = ns()
                try:
                    pid = gen()
                except CoordinatorLoadInProgressError:
                    lat.append(ns() - t0)
                    refusals += 1
                    refused_at.append(now)
                    if dry_since is None:
                        dry_since = now
                    break  # the rest stays owed, asked again next tick, as a client retries
                lat.append(ns() - t0)
                ids += 1
                if pid <= last:
                    ordered = False
                last = pid
                if dry_since is not None:
                    max_dry = max(max_dry, now - dry_since)
                    dry_since = None
        if dry_since is not None:
            max_dry = max(max_dry, time.monotonic() - dry_since)
        st = mgr.stats()
    finally:
        await mgr.close()
        await c.close()
    # The cost of the timing pair itself.
    empty = array.array("q")
    for _ in range(100_000):
        t0 = ns()
        empty.append(ns() - t0)
    return {"latency_ns": lat.tolist(), "timer_pair_ns": sorted(empty)[len(empty) // 2], "refusals": refusals,
            "refused_at": refused_at, "max_dry_s": max_dry, "ids": ids, "ids_increasing": ordered, "rate": rate,
            "manager_stats": {k: v for k, v in st.items() if isinstance(v, (int, float, str, dict))}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="one benchmark broker (started by pidctl bench)")
    ap.add_argument("--system", required=True, choices=("pidquorum", "zookeeper", "etcd"))
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--broker-id", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--mode", choices=("allocate", "manager"), default="allocate")
    ap.add_argument("--rate", type=float, default=10_000.0)
    a = ap.parse_args(argv)
    if a.mode == "manager":
        if a.system != "pidquorum":
            ap.error("--mode manager is pidquorum's broker-side ProducerIdManager")
        out = asyncio.run(run_manager(a.endpoints, a.broker_id, a.rate))
    elif a.system == "pidquorum":
        out = asyncio.run(run_pidquorum(a.endpoints, a.broker_id, a.warmup)).to_dict()
    else:
        alloc = (ZkAllocator if a.system == "zookeeper" else EtcdAllocator)(a.endpoints, a.broker_id)
        try:
            out = run_sync(alloc, a.warmup).to_dict()
        finally:
            alloc.close()
    with open(a.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
