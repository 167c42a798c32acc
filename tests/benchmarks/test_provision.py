"""benchmarks.provision against a stand-in apt-get (a shell script on PATH that logs its calls and
"installs" a command): nothing runs when the command is there, update then install when it
is not, parallel processes install once, and every refusal names the package and the
command to run by hand."""
from __future__ import annotations

import multiprocessing as mp
import stat

import pytest

from benchmarks import provision as apt

FAKE_APT = """#!/bin/sh
PATH=/usr/bin:/bin
echo "$DEBIAN_FRONTEND $*" >> "$FAKE_APT_LOG"
case "$*" in
  *" install "*)
    sleep 0.3
    [ -n "$FAKE_APT_FAIL" ] && { echo "E: Unable to locate package $FAKE_APT_FAIL"; exit 100; }
    for last in "$@"; do :; done
    printf '#!/bin/sh\\n' > "$FAKE_BIN/$last"; chmod +x "$FAKE_BIN/$last" ;;
esac
"""


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(FAKE_APT)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "apt.log"
    monkeypatch.setenv("PATH", str(bin_dir))  # no sudo, no real apt-get
    monkeypatch.setenv("FAKE_APT_LOG", str(log))
    monkeypatch.setenv("FAKE_BIN", str(bin_dir))
    monkeypatch.setattr(apt, "LOCK", str(tmp_path / "apt.lock"))
    monkeypatch.setattr(apt.os, "geteuid", lambda: 0)

    def calls() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []
    return calls


def test_present_command_runs_nothing(fake_apt):
    assert apt.ensure_installed("apt-get-itself", "apt-get") == 0.0
    assert apt.ensure_installed("x", lambda: True) == 0.0
    assert fake_apt() == []


def test_missing_command_is_installed_update_first_non_interactive(fake_apt):
    said = []
    assert apt.ensure_installed("pq-fake-tool", "pq-fake-tool", say=said.append) > 0
    assert fake_apt() == ["noninteractive -o DPkg::Lock::Timeout=300 update",
                          "noninteractive -o DPkg::Lock::Timeout=300 install -y --no-install-recommends pq-fake-tool"]
    assert said == ["installing pq-fake-tool with apt-get"]
    assert apt.ensure_installed("pq-fake-tool", "pq-fake-tool") == 0.0  # idempotent: no second run
    assert len(fake_apt()) == 2


def _install(_):
    return apt.ensure_installed("pq-parallel", "pq-parallel")


def test_parallel_processes_install_once(fake_apt):
    with mp.get_context("fork").Pool(3) as pool:
        took = pool.map(_install, range(3))
    assert sum(1 for t in took if t > 0) == 1
    assert sum(" install " in c for c in fake_apt()) == 1


def test_failed_install_names_the_package_and_apt_get_output(fake_apt, monkeypatch):
    monkeypatch.setenv("FAKE_APT_FAIL", "pq-nowhere")
    with pytest.raises(apt.AptUnavailable, match=r"apt-get install pq-nowhere failed \(exit 100\).*Unable to locate"):
        apt.ensure_installed("pq-nowhere", "pq-nowhere")


def test_no_apt_get_or_no_root_say_what_to_run(fake_apt, monkeypatch, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(apt.AptUnavailable, match="pq-tool.*no apt-get.*`apt-get install --no-install-recommends pq-tool`"):
        apt.ensure_installed("pq-tool", "pq-tool")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # apt-get there, no sudo
    monkeypatch.setattr(apt.os, "geteuid", lambda: 1000)
    with pytest.raises(apt.AptUnavailable, match=r"pq-tool.*root.*`apt-get install --no-install-recommends pq-tool`"):
        apt.ensure_installed("pq-tool", "pq-tool")
    assert fake_apt() == []
