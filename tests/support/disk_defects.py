"""Switches that put back defects of the production storage layer (``snapshots.storage.disk``), for tests only.

Like tests/support/defects.py: each is a context manager that patches ``snapshots.storage.disk`` from the outside
for the length of the block (worker processes forked inside it inherit the patch); nothing in a production
module reads a switch.  With a switch on, the simulation or the crash-state explorer, which now run the
production ``Disk`` over a simulated file system, must find a violation (tests/chaos/test_sim_fs.py).
"""
from __future__ import annotations

import contextlib

from snapshots.storage.disk import Disk


def _skip_sync_dir(path: str) -> None:
    """The directory fsync, not made."""


@contextlib.contextmanager
def dir_fsync_dropped_after_rename():
    """``Disk.write_file`` writes the temp file, fsyncs it and renames it over the path, but does not fsync
    the directory: the rename is not durable, so after a power loss the path may hold the old file again
    (an acknowledged snapshot install, a vote or a term reverts)."""
    original = Disk.write_file

    def write_file(self, path: str, data: bytes) -> None:
        self.sync_dir = _skip_sync_dir  # write_file's one directory fsync is its last step, after the rename
        try:
            original(self, path, data)
        finally:
            del self.sync_dir
    Disk.write_file = write_file
    try:
        yield
    finally:
        Disk.write_file = original


SWITCHES = {
    "dir-fsync-dropped-after-rename": dir_fsync_dropped_after_rename,
}
