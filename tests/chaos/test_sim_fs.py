"""The simulated file system (chaos/sim/fs.py) and the production ``snapshots.storage.disk.Disk`` over it (``SimDisk``):
the system calls of Disk's write discipline in order, every crash state at each of them, the POSIX crash
semantics the simulator relies on, and the simulation and the crash-state explorer finding a Disk that drops
the directory fsync after its rename (tests/support/disk_defects.py), and nothing without it."""
from __future__ import annotations

import contextlib
import errno
import os
import random

import pytest
from click.testing import CliRunner

from chaos.sim.disk import LossPolicy, MachineStopped, NodeHalted, SimDisk
from chaos.sim.fs import SimFS
from cli.main import cli
from quorum.journal import DurableJournal
from snapshots.store import SnapshotStore
from snapshots.storage.disk import StorageFailure
from tests.chaos.sim_support import quiet_logging  # noqa: F401 (quiet_logging: an autouse fixture)
from tests.support.disk_defects import dir_fsync_dropped_after_rename


def disk_with(files: dict[str, bytes]) -> SimDisk:
    """A SimDisk holding ``files`` under /d, everything durable."""
    disk = SimDisk()
    disk.make_dir("/d")
    for name, data in files.items():
        disk.write_file(f"/d/{name}", data)
    return disk


def switch(on: bool):
    return dir_fsync_dropped_after_rename() if on else contextlib.nullcontext()


# ------------------------------------------------- Disk's discipline, call by call
def test_write_file_is_create_write_fsync_rename_then_the_directory_fsync():
    disk = disk_with({"meta": b"old"})
    start = len(disk.ops)
    disk.write_file("/d/meta", b"new")
    assert [(op.kind, op.path) for op in disk.ops[start:]] == [
        ("create", "/d/meta.tmp"), ("write", "/d/meta.tmp"), ("fsync", "/d/meta.tmp"), ("rename", "/d/meta.tmp"),
        ("sync_dir", "/d")]
    assert disk.ops[start + 3].detail == {"to": "/d/meta"}


def write_file_crash_states(disk: SimDisk, path: str, old: bytes, new: bytes) -> list[str]:
    """Replace ``path`` (holding ``old``) with ``new``; before each of write_file's operations and once it
    returned, every crash state must hold ``old`` or ``new`` whole at ``path`` (only ``new`` once it returned).
    What is wrong, one line each."""
    wrong: list[str] = []

    def check(where: str, allowed: tuple[bytes, ...]):
        for label, image in disk.crash_states():
            held = image.read(path)
            if held not in allowed:
                wrong.append(f"{where}, {label}: {path} holds {held!r}")

    disk.on_op = lambda op: check(f"before {op}", (old, new))
    disk.write_file(path, new)
    disk.on_op = None
    check("after write_file returned", (new,))
    return wrong


@pytest.mark.parametrize("size", [3, 5000])
def test_a_power_loss_at_any_instant_of_write_file_leaves_the_old_file_or_the_new_one_whole(size):
    old, new = b"o" * size, b"n" * (size + 7)
    disk = disk_with({"raft.snapshot": old})
    assert write_file_crash_states(disk, "/d/raft.snapshot", old, new) == []


def test_without_the_directory_fsync_a_power_loss_after_write_file_returned_brings_the_old_file_back():
    disk = disk_with({"raft.snapshot": b"old"})
    with dir_fsync_dropped_after_rename():
        wrong = write_file_crash_states(disk, "/d/raft.snapshot", b"old", b"new")
    assert wrong and wrong[0].startswith("after write_file returned, all unsynced changes lost: "
                                         "/d/raft.snapshot holds b'old'")


def test_an_acknowledged_install_survives_a_power_loss_only_with_the_directory_fsync():
    for on, expected in ((False, b"installed"), (True, b"old")):
        disk = disk_with({})
        store = SnapshotStore("/d/raft.snapshot", disk)
        disk.write_file("/d/raft.snapshot", b"old")
        with switch(on):
            disk.write_file(store.path, b"installed")
        assert disk.power_loss().read("/d/raft.snapshot") == expected, f"switch {'on' if on else 'off'}"


def _journal_with_one_synced_entry():
    """A journal on a fresh disk holding one synced entry: the disk, the journal, the file's synced bytes."""
    disk = disk_with({})
    j = DurableJournal("/d/raft.journal", disk)
    j.add(b"a", 1, 1)
    j.sync()
    return disk, j, disk.read("/d/raft.journal")


def test_an_append_file_is_durable_only_up_to_its_last_fdatasync():
    disk, j, synced = _journal_with_one_synced_entry()
    j.add(b"b" * 40, 2, 1)
    j._file.write(bytes(j._pending))  # written, not synced
    assert disk.read("/d/raft.journal") != synced
    assert disk.power_loss().read("/d/raft.journal") == synced
    assert disk.crash().read("/d/raft.journal") == disk.read("/d/raft.journal")  # kill -9 keeps the page cache
    assert disk.crash().power_loss().read("/d/raft.journal") == synced  # ... and it is still unsynced
    assert disk.copy().power_loss().read("/d/raft.journal") == disk.read("/d/raft.journal")  # a backup is synced


# ------------------------------------------------------------- the file system
def test_an_unsynced_create_rename_or_unlink_is_undone_by_a_power_loss_and_kept_by_a_crash():
    fs = SimFS()
    fs.mkdir("/d")
    fs.fsync(fs.open("/", os.O_RDONLY | os.O_DIRECTORY))
    fd = fs.open("/d", os.O_RDONLY | os.O_DIRECTORY)
    for name in ("a", "b"):
        f = fs.open(f"/d/{name}", os.O_WRONLY | os.O_CREAT, 0o600)
        fs.write(f, name.encode())
        fs.fsync(f)
        fs.close(f)
    fs.fsync(fd)
    fs.replace("/d/a", "/d/b")
    new = fs.open("/d/c", os.O_WRONLY | os.O_CREAT, 0o600)
    fs.write(new, b"c")
    fs.fsync(new)
    assert fs.listdir("/d") == ["b", "c"] and fs.files("/d")["b"] == b"a"
    assert fs.power_loss().files("/d") == {"a": b"a", "b": b"b"}
    assert fs.crash().files("/d") == {"b": b"a", "c": b"c"}
    fs.fsync(fd)
    fs.unlink("/d/c")
    assert fs.power_loss().files("/d") == {"b": b"a", "c": b"c"}


def test_a_rename_is_atomic_in_every_crash_state():
    fs = SimFS()
    fs.mkdir("/d")
    for name in ("x", "x.tmp"):
        f = fs.open(f"/d/{name}", os.O_WRONLY | os.O_CREAT, 0o600)
        fs.write(f, name.encode())
        fs.fsync(f)
    fs.fsync(fs.open("/", os.O_RDONLY | os.O_DIRECTORY))
    fs.fsync(fs.open("/d", os.O_RDONLY | os.O_DIRECTORY))
    fs.replace("/d/x.tmp", "/d/x")
    held = sorted({tuple(sorted(image.files("/d").items())) for _, image in fs.crash_states()})
    assert held == [(("x", b"x"), ("x.tmp", b"x.tmp")), (("x", b"x.tmp"),)]


def test_a_directory_whose_entry_was_not_synced_is_gone_after_a_power_loss_with_its_files():
    disk = SimDisk()
    fs = disk.fs
    fs.mkdir("/d")
    f = fs.open("/d/f", os.O_WRONLY | os.O_CREAT, 0o600)
    fs.write(f, b"data")
    fs.fsync(f)
    fs.fsync(fs.open("/d", os.O_RDONLY | os.O_DIRECTORY))
    assert disk.power_loss().listdir("/d") == [] and not disk.power_loss().exists("/d")
    disk.make_dir("/e")  # Disk.make_dir syncs the parent
    assert disk.power_loss().exists("/e")


def test_o_trunc_o_append_lseek_and_the_errors_of_missing_files():
    fs = SimFS()
    fs.mkdir("/d")
    f = fs.open("/d/f", os.O_RDWR | os.O_CREAT, 0o600)
    fs.write(f, b"hello world")
    assert fs.lseek(f, 0, os.SEEK_SET) == 0 and fs.read(f, 5) == b"hello"
    assert fs.lseek(f, -5, os.SEEK_END) == 6 and fs.read(f, 100) == b"world" and fs.read(f, 100) == b""
    a = fs.open("/d/f", os.O_WRONLY | os.O_APPEND)
    fs.write(a, b"!")
    assert fs.files("/d")["f"] == b"hello world!" and fs.fstat(a).st_size == 12
    fs.pwrite(a, b"J", 0)
    fs.open("/d/f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    assert fs.files("/d")["f"] == b"" and fs.stat("/d/f").st_size == 0
    with pytest.raises(FileNotFoundError):
        fs.open("/d/none", os.O_RDONLY)
    with pytest.raises(FileNotFoundError):
        fs.open("/nodir/f", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(FileExistsError):
        fs.mkdir("/d")
    with pytest.raises(IsADirectoryError):
        fs.open("/d", os.O_WRONLY)
    with pytest.raises(OSError) as bad:
        fs.write(999, b"x")
    assert bad.value.errno == errno.EBADF


def test_a_torn_last_write_keeps_a_prefix_of_it_and_garbage_after():
    fs = SimFS()
    f = fs.open("/f", os.O_WRONLY | os.O_CREAT, 0o600)
    fs.fsync(fs.open("/", os.O_RDONLY | os.O_DIRECTORY))
    fs.write(f, b"A" * 100)
    kept = {fs.power_loss(LossPolicy("random", random.Random(seed), torn=0.5)).files("/")["f"] for seed in range(40)}
    assert b"" in kept and b"A" * 100 in kept
    torn = [k for k in kept if 0 < len(k) and k != b"A" * 100]
    assert torn and all(k.startswith(b"A") and len(k) == 100 for k in torn)


def test_crash_states_are_distinct_and_the_same_in_the_same_order_for_a_copy():
    disk = disk_with({"meta": b"m"})
    j = DurableJournal("/d/raft.journal", disk)
    j.add(b"x" * 30, 1, 1)
    j._file.write(bytes(j._pending))
    disk.write_file("/d/peers", b"p")
    disk.fs.replace("/d/peers", "/d/peers2")
    states = [(label, image.fingerprint()) for label, image in disk.crash_states()]
    assert len({fp for _, fp in states}) == len(states) > 3
    assert [(label, image.fingerprint()) for label, image in disk.clone().crash_states()] == states


# ---------------------------------------------------------------------- faults
def test_a_failed_fsync_fail_stops_the_node_and_drops_the_unsynced_bytes():
    disk, j, synced = _journal_with_one_synced_entry()
    disk.fail = lambda op: OSError(errno.EIO, "Input/output error") if op.kind == "fdatasync" else None
    j.add(b"b", 2, 1)
    with pytest.raises(NodeHalted) as halted:
        j.sync()
    assert halted.value.code == 74 and "fdatasync /d/raft.journal: Input/output error (EIO)" in halted.value.message
    failed = disk.ops[-1]
    assert failed.kind == "fdatasync" and failed.detail["error"] == "EIO"
    assert disk.read("/d/raft.journal") == synced  # the kernel dropped the dirty pages


def test_a_full_disk_fail_stops_with_enospc_and_a_failstop_that_returns_raises_storage_failure():
    disk = SimDisk(failstop=lambda code, message: None)
    disk.make_dir("/d")
    disk.capacity = disk.used() + 10
    with pytest.raises(StorageFailure) as full:
        disk.write_file("/d/big", b"x" * 11)
    assert "write /d/big.tmp: disk full (ENOSPC)" in str(full.value)
    disk.capacity = None
    disk.write_file("/d/big", b"x" * 11)
    assert disk.read("/d/big") == b"x" * 11


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_machine_stops_before_or_after_a_chosen_operation_and_nothing_more_reaches_the_disk(when):
    disk = disk_with({"meta": b"old"})
    disk.stop = lambda op, moment: op.kind == "rename" and moment == when
    with pytest.raises(MachineStopped):
        disk.write_file("/d/meta", b"new")
    assert disk.stopped
    with pytest.raises(MachineStopped):
        disk.write_file("/d/other", b"x")
    disk.stopped, disk.stop = False, None
    assert disk.read("/d/meta") == (b"old" if when == "before" else b"new")
    after = disk.power_loss()
    assert after.read("/d/meta") == b"old"  # the rename was never made durable
    assert after.read("/d/meta.tmp") in (None, b"new")


# ------------------------------------------------ the simulator and the explorer
def test_the_simulation_finds_a_disk_that_drops_the_directory_fsync_and_passes_without_it():
    args = ["chaos", "simulate", "--seeds", "1..4", "--steps", "4000", "--jobs", "1"]
    clean = CliRunner().invoke(cli, args)
    assert clean.exit_code == 0, clean.output
    with dir_fsync_dropped_after_rename():
        found = CliRunner().invoke(cli, args)
    assert found.exit_code == 5, found.output
    assert "and lost it" in found.output


def test_the_crash_state_explorer_finds_a_disk_that_drops_the_directory_fsync_and_passes_without_it():
    args = ["chaos", "crash-states", "--node", "2", "--around", "raft.snapshot", "--max-ops", "3",
            "--after-steps", "600", "--jobs", "1"]
    clean = CliRunner().invoke(cli, args)
    assert clean.exit_code == 0, clean.output
    with dir_fsync_dropped_after_rename():
        found = CliRunner().invoke(cli, args)
    assert found.exit_code == 5, found.output
    assert "error: node 2, power lost before" in found.output and "and lost it" in found.output
