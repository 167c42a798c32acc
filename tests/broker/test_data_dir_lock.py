"""One broker per data directory: a second broker on a directory in use stops at once, before it reads or
writes anything there, with one line naming the directory and the pid that holds it (exit 71, docs/cli.md);
the directory is free again once the first broker has stopped, however it stopped."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.processes import BrokerProcess
from snapshots.storage.lock import LOCK_FILE, DirectoryLockedError, lock_directory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXIT_OS = 71


def second_broker(data_dir: str, quorum: list[str], broker_id: int = 3) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "broker", "start", "--broker-id", str(broker_id),
                           "--quorum", ",".join(quorum), "--listen", "127.0.0.1:0", "--data-dir", data_dir],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_second_broker_on_the_same_data_dir_stops_naming_the_dir_and_the_holder(cluster, tmp_path):
    first = BrokerProcess(str(tmp_path / "brokers"), 1, cluster.lc.client_addresses()).start()
    try:
        r = second_broker(first.data_dir, cluster.lc.client_addresses())
        assert r.returncode == EXIT_OS, (r.returncode, r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].endswith(f"CRITICAL pidquorum.broker [broker=3]: refusing to start: the data directory "
                                 f"{os.path.abspath(first.data_dir)} is in use by another process (pid "
                                 f"{first.proc.pid}): two brokers must not share a data directory"), lines[0]
        first.stop()
        # Stopped (or killed: the kernel drops the lock with the process), the directory is free again.
        second = BrokerProcess(str(tmp_path / "brokers"), 1, cluster.lc.client_addresses()).start()
        second.kill()
        third = BrokerProcess(str(tmp_path / "brokers"), 1, cluster.lc.client_addresses()).start()
        third.stop()
    finally:
        first.stop()


def test_the_lock_is_exclusive_and_names_its_holder(tmp_path):
    d = str(tmp_path / "data")
    with lock_directory(d) as held:
        assert held.held and open(os.path.join(d, LOCK_FILE)).read() == f"{os.getpid()}\n"
        with pytest.raises(DirectoryLockedError) as e:
            lock_directory(d)  # another open file description: refused, also within one process
        assert e.value.holder == os.getpid() and e.value.directory == os.path.abspath(d)
        assert str(e.value) == f"the data directory {os.path.abspath(d)} is in use by another process (pid {os.getpid()})"
    assert not held.held
    lock_directory(d).release()  # released: taken again
