"""``python -m chaos.faultnode --config FILE``: a quorum node whose disk a chaos run can slow down.

The node is the production one (``quorum.node.run_node``); only its ``Disk`` is
different, so no production module reads a fault switch.  The chaos runner and
``pidctl bench`` start nodes through this module when they need a disk fault:

* ``slow-disk`` nemesis: while ``<data dir>/fault-sync-delay-ms`` holds ``N`` or
  ``MIN-MAX``, every journal or audit sync first sleeps N ms (or a uniform draw in
  MIN..MAX).  Switched at run time by creating or removing the file; looked at no
  more than once per ``FAULT_CHECK_INTERVAL``.
* ``--no-fsync`` (benchmarks only, to measure what durability costs): syncs of the
  append files return without fdatasync.  Such a node can lose acknowledged
  entries on power loss and logs so at start.
* ``--failpoint POINT=ACTION[:ARG]`` (repeatable): arms a failpoint (``chaos.faults``),
  e.g. ``quorum.allocate=reissue-latest-once``, the broken allocator.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time

from quorum.migration.bridge import ZooKeeperBridge
from quorum.config import ConfigError, load
from quorum.node import run_node, setup_logging
from snapshots.storage.disk import AppendFile, Disk

from .faults import add_option, arm_or_explain

log = logging.getLogger(__name__)

FAULT_SYNC_DELAY_FILE = "fault-sync-delay-ms"
FAULT_NODE_COMMAND = ("-m", "chaos.faultnode")  # LocalCluster.create(node_command=...)
FAULT_CHECK_INTERVAL = 0.1


def parse_delay(text: str | None, path: str) -> tuple[int, int] | None:
    """(min ms, max ms) from a fault-sync-delay-ms file's text; None (no delay) if absent or malformed."""
    if not text:
        return None
    low, _, high = text.partition("-")
    try:
        delay = (int(low), int(high or low))
    except ValueError:
        delay = (-1, -1)
    if not 0 <= delay[0] <= delay[1]:
        log.warning("%s: %r is not 'N' or 'MIN-MAX' (milliseconds); ignored", path, text)
        return None
    return delay if delay[1] > 0 else None


class _FaultAppendFile(AppendFile):
    def sync(self) -> None:
        self.disk.before_sync()
        if self.disk.fsync:
            super().sync()


class FaultDisk(Disk):
    """A ``Disk`` whose append-file syncs can be delayed (by a file in ``data_dir``) or skipped."""

    append_file_class = _FaultAppendFile

    def __init__(self, data_dir: str, fsync: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.fsync = fsync
        self.delay_path = os.path.join(data_dir, FAULT_SYNC_DELAY_FILE)
        self._text: str | None = None
        self._delay: tuple[int, int] | None = None
        self._checked = float("-inf")

    def before_sync(self) -> None:
        now = time.monotonic()
        if now - self._checked >= FAULT_CHECK_INTERVAL:
            self._checked = now
            try:
                with open(self.delay_path) as f:
                    text = f.read().strip()
            except OSError:
                text = None
            if text != self._text:
                self._text = text
                delay = parse_delay(text, self.delay_path)
                if delay:
                    log.warning("every sync is delayed %d-%d ms (fault injection: %s)", *delay, self.delay_path)
                elif self._delay:
                    log.warning("sync delay off")
                self._delay = delay
        if self._delay:
            time.sleep(random.uniform(*self._delay) / 1000)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.faultnode")
    ap.add_argument("--config", required=True)
    ap.add_argument("--ready-file")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--no-fsync", action="store_true", help="benchmarks only: never fdatasync the append files")
    add_option(ap)
    args = ap.parse_args(argv)
    setup_logging(args.log_level, "human")
    if not arm_or_explain(args.failpoint, "pidquorum"):
        return 2
    try:
        cfg = load(args.config)
    except ConfigError as e:
        print(f"pidquorum: {e}", file=sys.stderr)
        return 2
    if args.no_fsync:
        log.warning("node %d: --no-fsync: journal entries are NOT fsync'd; a power loss can re-issue IDs", cfg.node_id)
    return run_node(cfg, args.ready_file, disk=FaultDisk(cfg.data_dir, fsync=not args.no_fsync),
                    zookeeper=ZooKeeperBridge())


if __name__ == "__main__":
    sys.exit(main())
