"""pidctl audit run tells a person at a terminal which phase it is in (stderr), and prints nothing more
when stderr is not a terminal."""
from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from chaos.audit.job import PHASES, run_audit
from cli.common import EXIT_OK
from cli.main import cli
from tests.audit.test_job import clean_sources, write_export

PIDCTL = os.path.join(os.path.dirname(sys.executable), "pidctl")
pytestmark = pytest.mark.xdist_group("spark")  # beside tests/audit/test_job.py: one JVM per worker


def test_run_audit_tells_each_phase_as_it_starts(spark, tmp_path):
    told = []
    report = run_audit(write_export(tmp_path / "in", clean_sources()), out_dir=str(tmp_path / "out"),
                       progress=lambda i, phase: told.append((i, phase)))
    assert report["valid"]
    assert told == list(enumerate(p for _, p in PHASES))  # every phase once, in order, with blocks
    assert told[0][1].startswith("reading inputs") and told[-1][1] == "writing the report and charts"


def test_audit_run_off_a_terminal_prints_no_progress(spark, tmp_path):
    inp = write_export(tmp_path / "in", clean_sources())
    res = CliRunner().invoke(cli, ["audit", "run", "--input", inp, "--out", str(tmp_path / "out")])
    assert res.exit_code == EXIT_OK, res.output
    assert res.stderr == "" and "VALID" in res.stdout


def test_audit_run_on_a_terminal_shows_its_phases_on_stderr(tmp_path):
    inp = write_export(tmp_path / "in", clean_sources())
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen([PIDCTL, "audit", "run", "--input", inp, "--out", str(tmp_path / "out"),
                             "--master", "local[1]"], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env, cwd=str(tmp_path))
    os.close(slave)
    seen = bytearray()

    def drain():  # the terminal's side: read until the process closes it
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(30)
    os.close(master)
    assert proc.returncode == EXIT_OK, (out, bytes(seen)[-2000:])
    terminal = seen.decode(errors="replace")
    assert "starting Spark" in terminal
    assert "Spark job:" in terminal or "checks:" in terminal
    assert b"VALID" in out and b"starting Spark" not in out  # the report on stdout, the progress beside it
