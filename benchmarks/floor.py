"""The floor of a replicated, fsync'd commit on this machine, in Python: a client, a leader and two
followers passing 256-byte requests and fdatasyncing them as the journal does, nothing else; what
workload 1 could reach (``pidctl bench`` measures it beside workload 1; details: docs/benchmarks.md).

    python -m benchmarks.floor run DIR [--duration S]   # prints the figures as JSON
    python -m benchmarks.floor syncs DIR [--count N]    # fdatasync of appends: growing vs preallocated file
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import socket
import struct
import subprocess
import sys
import time

from snapshots.storage.disk import PREALLOCATE, AppendFile, Disk

from .common import percentile

MESSAGE = 256
_LEN = struct.Struct(">I")


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


async def _read(reader: asyncio.StreamReader) -> bytes:
    n = _LEN.unpack(await reader.readexactly(4))[0]
    return await reader.readexactly(n)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _serve(handler, port_file: str) -> None:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    os.replace(tmp, port_file)
    async with server:
        await server.serve_forever()


async def _serve_commits(path: str, port_file: str, commit) -> None:
    """Append each request to ``path`` (a preallocated ``AppendFile``), ``await commit(file, request)``,
    answer; then await what ``commit`` returned (work that may finish after the answer), before the next
    request."""
    disk = Disk()
    disk.write_file(path, b"")
    file = disk.open_append(path)

    async def handle(reader, writer):
        _nodelay(writer)
        try:
            while True:
                m = await _read(reader)
                file.reserve(file.size + len(m))
                file.write(m)
                after = await commit(file, m)
                writer.write(_frame(m[:8]))
                if after is not None:
                    await after
        except asyncio.IncompleteReadError:
            writer.close()

    await _serve(handle, port_file)


async def follower(path: str, port_file: str) -> None:
    async def commit(file: AppendFile, m: bytes) -> None:
        file.sync()

    await _serve_commits(path, port_file, commit)


async def leader(path: str, port_file: str, follower_ports: list[int]) -> None:
    syncer = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    links = [await asyncio.open_connection("127.0.0.1", p) for p in follower_ports]
    for _, w in links:
        _nodelay(w)
    behind = [0] * len(links)  # acknowledgements still to read on each link

    async def drain(i: int) -> None:
        while behind[i]:
            await _read(links[i][0])
            behind[i] -= 1

    async def commit(file: AppendFile, m: bytes):
        own = loop.run_in_executor(syncer, file.sync)
        for i, (_, w) in enumerate(links):
            w.write(_frame(m))
            behind[i] += 1
        acks = [asyncio.ensure_future(drain(i)) for i in range(len(links))]
        await asyncio.wait(acks, return_when=asyncio.FIRST_COMPLETED)
        await own
        return asyncio.gather(*acks)  # the slower follower's, before the next request

    await _serve_commits(path, port_file, commit)


async def client(port: int, duration: float, warmup: float) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    _nodelay(writer)
    payload = os.urandom(MESSAGE - 1) + b"\xff"  # never ends in a zero: what a follower wrote is countable
    lat = []
    start = time.monotonic()
    measure_from, end = start + warmup, start + warmup + duration
    while True:
        t0 = time.monotonic()
        if t0 >= end:
            break
        writer.write(_frame(payload))
        await _read(reader)
        if t0 >= measure_from:
            lat.append(time.monotonic() - t0)
    writer.close()
    lat.sort()
    return {"commits": len(lat), "commits_per_s": len(lat) / duration if duration else None,
            "p50_ms": percentile(lat, 50) * 1000 if lat else None,
            "p99_ms": percentile(lat, 99) * 1000 if lat else None}


def _wait_port(path: str, proc: subprocess.Popen, timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                return int(f.read())
        if proc.poll() is not None:
            raise RuntimeError(f"floor process {proc.args} exited with {proc.returncode}")
        time.sleep(0.01)
    raise RuntimeError(f"floor process {proc.args} did not listen within {timeout}s")


def measure(directory: str, duration: float = 5.0, warmup: float = 0.5) -> dict:
    """Start the three server processes, run the client process, stop them; the client's figures plus
    the bytes each follower wrote (a check that every message was written)."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    me = [sys.executable, "-m", "benchmarks.floor"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_root(), os.environ.get("PYTHONPATH")]))}
    procs: list[subprocess.Popen] = []
    try:
        ports = []
        for i in range(2):
            p = subprocess.Popen(me + ["follower", os.path.join(directory, f"follower-{i}.log"),
                                       os.path.join(directory, f"follower-{i}.port")], env=env)
            procs.append(p)
            ports.append(_wait_port(os.path.join(directory, f"follower-{i}.port"), p))
        lp = subprocess.Popen(me + ["leader", os.path.join(directory, "leader.log"),
                                    os.path.join(directory, "leader.port"), *map(str, ports)], env=env)
        procs.append(lp)
        port = _wait_port(os.path.join(directory, "leader.port"), lp)
        out = subprocess.run(me + ["client", str(port), str(duration), str(warmup)], env=env, check=True,
                             capture_output=True, text=True, timeout=duration + warmup + 60)
        res = json.loads(out.stdout)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    res["follower_bytes"] = [_written(os.path.join(directory, f"follower-{i}.log")) for i in range(2)]
    res["message_bytes"] = MESSAGE
    return res


def sync_writer(path: str, preallocate: int, count: int) -> dict:
    """``count`` 256-byte writes, each fdatasync'd, to a new file grown as it goes (``preallocate`` 0) or
    preallocated ahead (``snapshots.storage.disk``'s way); the write + fdatasync latencies."""
    disk = Disk(preallocate=preallocate)
    disk.write_file(path, b"")
    file = disk.open_append(path)
    message = os.urandom(MESSAGE)
    lat = []
    for _ in range(count):
        file.reserve(file.size + MESSAGE)
        t0 = time.perf_counter()
        file.write(message)
        file.sync()
        lat.append(time.perf_counter() - t0)
    file.close()
    lat.sort()
    return {"p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000}


def measure_syncs(directory: str, count: int = 1500, writers: int = 3) -> dict:
    """``writers`` processes at once (as three nodes on one disk), each ``sync_writer``; first with files
    that grow at every write, then with preallocated ones, twice over.  Each figure is
    the median over the writers and rounds of a writer's p50 / p99."""
    os.makedirs(directory, exist_ok=True)
    me = [sys.executable, "-m", "benchmarks.floor"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_root(), os.environ.get("PYTHONPATH")]))}
    out: dict = {"writers": writers, "count": count, "message_bytes": MESSAGE}
    runs: dict[str, list[dict]] = {"growing": [], "preallocated": []}
    for _ in range(2):
        for mode, step in (("growing", 0), ("preallocated", PREALLOCATE)):
            procs = [subprocess.Popen(me + ["sync-writer", os.path.join(directory, f"{mode}-{i}.log"), str(step),
                                            str(count)], env=env, stdout=subprocess.PIPE, text=True)
                     for i in range(writers)]
            for p in procs:
                runs[mode].append(json.loads(p.communicate(timeout=300)[0]))
            for i in range(writers):
                os.remove(os.path.join(directory, f"{mode}-{i}.log"))
    for mode, rs in runs.items():
        out[mode] = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in ("p50_ms", "p99_ms")}
    return out


def _written(path: str) -> int:
    """The bytes written to a preallocated file (every message ends in a non-zero byte; zeros follow)."""
    with open(path, "rb") as f:
        return len(f.read().rstrip(b"\0"))


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="role", required=True)
    r = sub.add_parser("run", help="measure: start the processes, print the figures as JSON")
    r.add_argument("directory")
    r.add_argument("--duration", type=float, default=5.0)
    y = sub.add_parser("syncs", help="fdatasync of 256-byte writes, 3 processes at once: growing vs preallocated "
                                     "files; prints JSON")
    y.add_argument("directory")
    y.add_argument("--count", type=int, default=1500)
    w = sub.add_parser("sync-writer")
    w.add_argument("path")
    w.add_argument("preallocate", type=int)
    w.add_argument("count", type=int)
    f = sub.add_parser("follower")
    f.add_argument("path")
    f.add_argument("port_file")
    ld = sub.add_parser("leader")
    ld.add_argument("path")
    ld.add_argument("port_file")
    ld.add_argument("follower_ports", nargs=2, type=int)
    c = sub.add_parser("client")
    c.add_argument("port", type=int)
    c.add_argument("duration", type=float)
    c.add_argument("warmup", type=float)
    a = ap.parse_args(argv)
    if a.role == "run":
        print(json.dumps(measure(a.directory, a.duration)))
    elif a.role == "syncs":
        print(json.dumps(measure_syncs(a.directory, a.count)))
    elif a.role == "sync-writer":
        print(json.dumps(sync_writer(a.path, a.preallocate, a.count)))
    elif a.role == "follower":
        asyncio.run(follower(a.path, a.port_file))
    elif a.role == "leader":
        asyncio.run(leader(a.path, a.port_file, a.follower_ports))
    else:
        print(json.dumps(asyncio.run(client(a.port, a.duration, a.warmup))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
