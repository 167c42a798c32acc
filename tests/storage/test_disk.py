"""``snapshots.storage.disk.Disk`` over the real ``os``: the system calls it makes, in order (through a recording
``os``-like object, the seam the simulator uses), and what they leave on disk.  The same discipline over a
simulated file system, with crash states, is in tests/chaos/test_sim_fs.py."""
from __future__ import annotations

import errno
import os

import pytest

from snapshots.storage.disk import Disk, StorageFailure
from tests.support.disk_defects import dir_fsync_dropped_after_rename

CALLS = ("open", "read", "write", "pwrite", "lseek", "fsync", "fdatasync", "ftruncate", "close", "replace",
         "unlink", "mkdir", "stat", "fstat")


class RecordingOS:
    """The ``os`` module, with each call ``Disk`` makes recorded as (call, path or what the fd names)."""

    def __init__(self, fail: dict | None = None):
        self.calls: list[tuple[str, str]] = []
        self.names: dict[int, str] = {}
        self.fail = fail or {}  # call -> errno to raise instead of making it

    def __getattr__(self, name):
        if name not in CALLS:
            raise AttributeError(name)
        real = getattr(os, name)

        def call(*args):
            first = args[0]
            what = self.names.get(first, f"fd {first}") if isinstance(first, int) else os.fspath(first)
            self.calls.append((name, what))
            if name in self.fail:
                raise OSError(self.fail[name], os.strerror(self.fail[name]))
            result = real(*args)
            if name == "open":
                self.names[result] = what
            return result
        return call

    def durable(self) -> list[tuple[str, str]]:
        """The calls that change a file or a directory, or make it durable."""
        return [(c, w) for c, w in self.calls if c not in ("lseek", "stat", "fstat", "close", "read")]


def raising(code, message):
    """A failstop that does not stop (``Disk`` then raises ``StorageFailure``)."""


def test_write_file_writes_a_temp_file_fsyncs_renames_and_fsyncs_the_directory(tmp_path):
    path = str(tmp_path / "identity")
    sys_ = RecordingOS()
    Disk(raising, os_module=sys_).write_file(path, b"new")
    assert sys_.durable() == [("open", path + ".tmp"), ("write", path + ".tmp"), ("fsync", path + ".tmp"),
                              ("replace", path + ".tmp"), ("open", str(tmp_path)), ("fsync", str(tmp_path))]
    assert open(path, "rb").read() == b"new" and not os.path.exists(path + ".tmp")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"


def test_without_the_directory_fsync_the_recorded_calls_show_it(tmp_path):
    """The check above fails with the switch on: the rename is never made durable."""
    path = str(tmp_path / "identity")
    sys_ = RecordingOS()
    with dir_fsync_dropped_after_rename():
        Disk(raising, os_module=sys_).write_file(path, b"new")
    assert ("fsync", str(tmp_path)) not in sys_.durable() and ("replace", path + ".tmp") in sys_.durable()


def test_an_append_file_grows_by_zeros_synced_before_the_writes_reach_them(tmp_path):
    path = str(tmp_path / "raft.journal")
    disk = Disk(raising, preallocate=4096)
    disk.write_file(path, b"HEAD")
    sys_ = RecordingOS()
    disk.os = sys_
    f = disk.open_append(path)
    f.reserve(f.size + 10)
    f.write(b"entry")
    f.sync()
    f.truncate(6)
    f.close()
    assert sys_.durable() == [("open", path), ("pwrite", path), ("fdatasync", path), ("write", path),
                              ("fdatasync", path), ("ftruncate", path), ("fdatasync", path)]
    assert open(path, "rb").read() == b"HEADen"


def test_reads_go_through_the_injected_os_and_a_missing_file_is_none(tmp_path):
    path = str(tmp_path / "peers")
    disk = Disk(raising, os_module=(sys_ := RecordingOS()))
    assert disk.read(path) is None and disk.size(path) is None and not disk.exists(path)
    disk.write_file(path, b"0123456789")
    assert disk.read(path, 4) == b"456789" and disk.size(path) == 10 and disk.exists(path)
    assert [c for c, _ in sys_.calls].count("read") >= 2


def test_make_dir_creates_each_missing_level_and_syncs_its_parent(tmp_path):
    target = str(tmp_path / "a" / "b")
    sys_ = RecordingOS()
    Disk(raising, os_module=sys_).make_dir(target)
    assert sys_.durable() == [("mkdir", str(tmp_path / "a")), ("open", str(tmp_path)), ("fsync", str(tmp_path)),
                              ("mkdir", target), ("open", str(tmp_path / "a")), ("fsync", str(tmp_path / "a"))]
    assert oct(os.stat(target).st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("call, op", [("fsync", "fsync"), ("replace", "rename"), ("write", "write"),
                                      ("open", "create")])
def test_an_io_error_in_write_file_fail_stops_with_exit_74_naming_the_call(tmp_path, call, op):
    stops = []
    disk = Disk(lambda code, message: stops.append((code, message)), os_module=RecordingOS({call: errno.EIO}))
    with pytest.raises(StorageFailure) as failure:
        disk.write_file(str(tmp_path / "x"), b"data")
    assert stops and stops[0][0] == 74 and f"{op} {tmp_path / 'x'}.tmp" in stops[0][1]
    assert "Input/output error (EIO)" in str(failure.value)


def test_a_full_disk_is_named_so(tmp_path):
    stops = []
    disk = Disk(lambda code, message: stops.append(message), os_module=RecordingOS({"write": errno.ENOSPC}))
    with pytest.raises(StorageFailure):
        disk.write_file(str(tmp_path / "x"), b"data")
    assert "disk full (ENOSPC)" in stops[0]
