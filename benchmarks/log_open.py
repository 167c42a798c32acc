"""Opening a partition after a restart, with and without its segment index files (broker/log.py), after a
clean close and after a crash, and with one producer per batch (``--producers``); no quorum, no network.

    python -m benchmarks.log_open [--batches 1000000] [--producers] [--repeat 3] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import struct
import tempfile
import time

from crc32c import crc32c

from broker.log import PartitionLog
from broker.partition import Partition
from broker.recordbatch import encode_batch

CHUNK = 10_000
_PRODUCER = struct.Struct(">qhi")  # producer id, epoch, base sequence at byte 43 of a v2 batch
_PRODUCER_AT = 43
_CRC_AT, _ATTRIBUTES_AT = 17, 21


def _batch_of(producer_id: int, template: bytes) -> bytes:
    """``template`` with another producer id (and its CRC-32C recomputed): cheaper than encoding anew."""
    b = bytearray(template)
    _PRODUCER.pack_into(b, _PRODUCER_AT, producer_id, 0, 0)
    struct.pack_into(">I", b, _CRC_AT, crc32c(memoryview(b)[_ATTRIBUTES_AT:]))
    return bytes(b)


def build(directory: str, batches: int, producers: bool) -> None:
    t0 = time.perf_counter()
    if producers:
        template = encode_batch([(None, b"v" * 10)], timestamp_ms=1_700_000_000_000, producer_id=1,
                                producer_epoch=0, base_sequence=0)
        with Partition(directory, fsync=False, snapshot_every=10**9) as p:
            for start in range(0, batches, CHUNK):
                blob = b"".join(_batch_of(1000 + i, template) for i in range(start, min(batches, start + CHUNK)))
                res = p.append(blob)
                assert res.ok, res
    else:
        batch = encode_batch([(None, b"v" * 10)], timestamp_ms=1_700_000_000_000)
        with PartitionLog(directory, fsync=False) as lg:
            for start in range(0, batches, CHUNK):
                lg.append([batch] * min(CHUNK, batches - start))
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".log"))
    print(f"built {batches:,} batches, {size / 2**20:.1f} MiB of segments, in {time.perf_counter() - t0:.1f} s")


def _best(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _open_log(directory: str) -> dict:
    with PartitionLog(directory, fsync=False) as lg:
        return dict(lg.open_stats, end=lg.log_end_offset)


def _open_partition(directory: str) -> dict:
    t0 = time.perf_counter()
    with Partition(directory, fsync=False) as p:
        return {"producers": p.describe_producers(0)[1], "end": p.log_end_offset,
                "log_open_ms": p.log.open_stats["open_ms"],
                "open_ms": round((time.perf_counter() - t0) * 1000, 1)}


def _indexes(directory: str) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.endswith(".index"))


def _half_active_index(directory: str) -> None:
    """Make the active segment's index cover only about its first half, as after a crash: the log's own
    index writer, on a shortened copy of the in-memory arrays; the log is then dropped unclosed (a clean
    close would write the whole index again)."""
    with PartitionLog(directory, fsync=False) as lg:
        active = lg._segments[-1]  # a benchmark sets up the state a crash leaves
        keep = len(active) // 2  # batches 0..keep-1 stay indexed; batch keep starts where the index ends
        active.size, active.end_offset = active.positions[keep], active.offsets[keep]
        del active.offsets[keep:], active.positions[keep:], active.cummax[keep:]
        active.index_size = -1
        lg._write_index(active)
        lg._segments = []


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.log_open", description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=1_000_000)
    ap.add_argument("--producers", action="store_true", help="one idempotent producer per batch, via Partition")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="build here (kept) instead of a temporary directory")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="pq-log-open-")
    directory = os.path.join(root, "t-0")
    try:
        build(directory, args.batches, args.producers)
        saved = {name: open(os.path.join(directory, name), "rb").read() for name in _indexes(directory)}
        t, stats = _best(args.repeat, lambda: _open_log(directory))
        print(f"PartitionLog open, index files:          {t * 1000:8.1f} ms  {stats}")
        if args.producers:
            t, stats = _best(args.repeat, lambda: _open_partition(directory))
            print(f"Partition open, index files:             {t * 1000:8.1f} ms  {stats}")
        _half_active_index(directory)
        t, stats = _best(1, lambda: _open_log(directory))  # once: its close indexes the whole active segment
        print(f"PartitionLog open, active half indexed:  {t * 1000:8.1f} ms  {stats}")
        for name in _indexes(directory):
            os.unlink(os.path.join(directory, name))

        def without():
            out = _open_log(directory)
            for name in _indexes(directory):  # sealed indexes are rewritten by the open: remove them again
                os.unlink(os.path.join(directory, name))
            return out

        t, stats = _best(args.repeat, without)
        print(f"PartitionLog open, no index files:       {t * 1000:8.1f} ms  {stats}")
        if args.producers:
            def without_p():
                out = _open_partition(directory)
                for name in _indexes(directory):
                    os.unlink(os.path.join(directory, name))
                return out

            t, stats = _best(args.repeat, without_p)
            print(f"Partition open, no index files:          {t * 1000:8.1f} ms  {stats}")
        for name, data in saved.items():
            open(os.path.join(directory, name), "wb").write(data)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
