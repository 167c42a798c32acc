"""Chaos runs end to end: a short kill-leader run passes; a deliberately broken allocator
under the same faults is caught; `pidctl chaos check` re-checks a run offline and refuses
directories that are not runs with one line and a non-zero exit."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from chaos.faults import BROKEN_ALLOCATOR
from chaos.history import read_history
from chaos.runner import FINAL, HISTORY, RunConfig, RunError, check_dir, run
from chaos.workload import WorkloadConfig


def _pidctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def kill_leader_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("chaos") / "kill-leader")
    cfg = RunConfig(scenario="kill-leader", duration_s=30, seed=7, out_dir=out, interval_s=(3.0, 3.5),
                    hold_s=(0.5, 1.0), keep_data=True,
                    workload=WorkloadConfig(brokers=2, block_rate=20, pid_managers=2, pid_rate=500))
    verdict = asyncio.run(run(cfg))
    return out, verdict


def test_short_kill_leader_run_passes_with_at_least_five_kills(kill_leader_run):
    out, verdict = kill_leader_run
    d = verdict.to_dict()
    assert verdict.valid, json.dumps(d["anomalies"], indent=1)[:4000]
    ops = read_history(os.path.join(out, HISTORY))
    kills = [op for op in ops if op.process == "nemesis" and op.type == "ok" and op.f == "kill-leader"]
    assert len(kills) >= 5
    assert sum(1 for op in ops if op.f == "generate" and op.type == "ok") > 5_000
    assert sum(1 for op in ops if op.f == "allocate" and op.type == "ok") > 100
    for name in (HISTORY, FINAL, "verdict.json", "timeline.png", "run.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name


def test_saved_run_rechecks_offline_with_the_same_verdict(kill_leader_run):
    out, verdict = kill_leader_run
    again = check_dir(out, write=False)
    assert again.valid == verdict.valid and again.anomaly_counts == verdict.anomaly_counts
    r = _pidctl("chaos", "check", out, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["valid"] is True


def test_broken_allocator_under_kill_leader_is_caught(tmp_path):
    out = str(tmp_path / "broken")
    cfg = RunConfig(scenario="kill-leader", duration_s=12, seed=3, out_dir=out, interval_s=(2.0, 2.5),
                    hold_s=(0.5, 0.8), node_faults=(BROKEN_ALLOCATOR,),
                    workload=WorkloadConfig(brokers=2, block_rate=20, pid_managers=1, pid_rate=300))
    verdict = asyncio.run(run(cfg))
    assert not verdict.valid
    kinds = set(verdict.anomaly_counts)
    assert kinds & {"overlapping-blocks", "duplicate-pid", "block-not-committed"}, kinds
    # A failing run keeps what is needed to investigate: history, logs and data directories.
    assert os.path.exists(os.path.join(out, HISTORY))
    node_dir = os.path.join(out, "cluster", "node-1")
    assert os.path.exists(os.path.join(node_dir, "audit.log"))
    r = _pidctl("chaos", "check", out)
    assert r.returncode == 5 and "INVALID" in r.stdout


@pytest.mark.parametrize("make", ["missing", "empty", "foreign", "truncated", "no-final", "bad-final"])
def test_chaos_check_refuses_what_is_not_a_run(tmp_path, kill_leader_run, make):
    good, _ = kill_leader_run
    target = tmp_path / "target"
    if make != "missing":
        target.mkdir()
    if make == "foreign":
        (target / HISTORY).write_text("this is not json\n")
        (target / FINAL).write_text("{}\n")
    elif make in ("truncated", "no-final", "bad-final"):
        data = open(os.path.join(good, HISTORY), "rb").read()
        cut = len(data) // 2
        # Torn inside a line: neither after a newline nor right before one.  A cut before a newline leaves a
        # whole last line without its newline, which parses: a shorter history, not a torn one.
        while b"\n" in data[cut - 1:cut + 1]:
            cut -= 1
        (target / HISTORY).write_bytes(data[:cut] if make == "truncated" else data)
        if make == "truncated":
            (target / FINAL).write_bytes(open(os.path.join(good, FINAL), "rb").read())
        if make == "bad-final":
            (target / FINAL).write_text('{"nodes": 3}')
    with pytest.raises(Exception) as ei:
        check_dir(str(target), write=False)
    assert type(ei.value).__name__ in ("RunError", "HistoryError")
    r = _pidctl("chaos", "check", str(target))
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in r.stderr, r.stderr


def test_run_refuses_a_used_directory_and_an_unknown_scenario(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "something").write_text("x")
    with pytest.raises(RunError, match="not empty"):
        asyncio.run(run(RunConfig(scenario="kill-leader", out_dir=str(used))))
    with pytest.raises(RunError, match="unknown scenario"):
        asyncio.run(run(RunConfig(scenario="meteor-strike", out_dir=str(tmp_path / "new"))))
