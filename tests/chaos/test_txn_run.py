"""The transactions chaos run end to end: a real three-node quorum, a real broker process, confluent-kafka
and kafka-python transactional producers (and an idempotent producer of each), a leader pause, a pause of
the node the broker sends its quorum requests to, a broker kill and two fences; the run must complete,
check a meaningful number of transactions and find nothing.
``pidctl chaos check`` re-checks the run directory (the workload read from run.json), and finds a value
taken out of the read-back.  The schedule the seed draws is checked without processes."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from chaos.history import read_history
from chaos.runner import RunError
from chaos.txn_checker import ANOMALIES
from chaos.txn_runner import (
    FAULTS,
    HISTORY,
    READBACK,
    RUN,
    START_S,
    VERDICT,
    TxnRunConfig,
    check_dir,
    run,
    schedule,
)
from chaos.txn_workload import TxnWorkloadConfig
import cli.chaos
from cli.main import cli as pidctl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEDULE = [
    {"at_s": 2.0, "fault": "pause-leader", "hold_s": 3.5, "pick": 0.0},
    {"at_s": 6.5, "fault": "pause-broker-peer", "hold_s": 3.0, "pick": 0.0},
    {"at_s": 14.5, "fault": "fence", "hold_s": 0.0, "pick": 0.1},   # a confluent-kafka producer
    {"at_s": 16.0, "fault": "kill-broker", "hold_s": 1.0, "pick": 0.0},
    {"at_s": 20.0, "fault": "fence", "hold_s": 0.0, "pick": 0.9},   # a kafka-python producer
]


def _pidctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_a_transactions_run_end_to_end(tmp_path):
    """One run (under pytest-xdist a module fixture could run once per worker), then everything that reads
    its directory."""
    out = str(tmp_path / "run")
    # 30 s, not the schedule's 21: a fault starts after the one before has healed, and the broker's restart
    # waits out its registration's session (7 s here, 11 s on a loaded 2-core CI machine), so the last fence
    # can come at 29 s; the run drops a fault that would end past its duration + 5 s.
    cfg = TxnRunConfig(duration_s=30, seed=11, out_dir=out, schedule=SCHEDULE,
                       workload=TxnWorkloadConfig(partitions=4, txn_producers=1, idempotent_producers=1))
    verdict = asyncio.run(run(cfg))
    _the_run_completes_checks_both_libraries_and_finds_no_anomaly(out, verdict)
    _pidctl_chaos_check_dispatches_on_the_workload_and_prints_every_class(out, verdict)
    _a_committed_value_taken_out_of_the_read_back_is_a_lost_write(out, tmp_path)
    _check_refuses_an_unfinished_transactions_run(out, tmp_path)


def _the_run_completes_checks_both_libraries_and_finds_no_anomaly(out, verdict):
    d = verdict.to_dict()
    st = d["stats"]
    meta = json.load(open(os.path.join(out, RUN)))
    # The run did what it was asked: every fault applied (none failed or skipped), the producers alive.
    assert [f["fault"] for f in meta["faults"]] == [e["fault"] for e in SCHEDULE]
    assert all(f["error"] is None and not (f["start"] or {}).get("skipped") and not (f["start"] or {}).get("failed")
               for f in meta["faults"]), meta["faults"]
    assert meta["faults"][0]["start"]["node"] is not None  # a leader was found and paused
    assert meta["faults"][1]["start"]["node"] is not None  # so was the node the broker sent its requests to
    assert st["fences"] == 2
    assert not [w for w, x in meta["workers"].items() if x["stopped_with"]], meta["workers"]
    # A meaningful number of transactions of both libraries, read back whole.
    by_lib = st["transactions_by_lib"]
    assert set(by_lib) == {"confluent-kafka", "kafka-python"}
    for lib, counts in by_lib.items():
        assert counts.get("committed", 0) >= 30, (lib, counts)
    assert st["transactions"] >= 80
    assert st["idempotent"]["acknowledged"] >= 50
    assert set(st["idempotent"]["by_lib"]) == {"confluent-kafka", "kafka-python"}
    assert st["read_committed_records"] >= st["transactional_values"] // 2
    assert st["polls"] >= 20 and st["lso_samples"] >= 20 and st["markers"].get("commit", 0) >= 60
    # The verdict: clean.  (If not, the anomalies' examples say which transactions and what was seen.)
    assert verdict.valid, json.dumps({k: d[k] for k in ("anomaly_counts", "anomalies", "warnings")}, indent=1)[:6000]
    assert d["anomaly_counts"] == {}
    for name in (HISTORY, READBACK, VERDICT, RUN, "clients.log"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    ops = read_history(os.path.join(out, HISTORY))
    assert {op.process for op in ops} >= {"txn-cf-1", "txn-kp-1", "idem-cf-1", "idem-kp-1", "reader-rc",
                                          "reader-lso", "nemesis"}


def _pidctl_chaos_check_dispatches_on_the_workload_and_prints_every_class(out, verdict):
    again = check_dir(out, write=False)
    assert again.valid == verdict.valid and again.anomaly_counts == verdict.anomaly_counts
    r = _pidctl("chaos", "check", out, "-o", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["workload"] == "transactions" and d["valid"] is True and d["anomaly_classes"] == list(ANOMALIES)
    r = _pidctl("chaos", "check", out)
    assert r.returncode == 0, r.stderr
    assert "VALID" in r.stdout and all(kind in r.stdout for kind in ANOMALIES)


def _a_committed_value_taken_out_of_the_read_back_is_a_lost_write(out, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("cluster", "broker-1"))
    with open(os.path.join(copy, READBACK)) as f:
        rb = json.load(f)
    committed = rb["read_committed"]["records"]
    victim = next(r for r in committed if r[2].startswith("txn-"))
    rb["read_committed"]["records"] = [r for r in committed if r != victim]
    with open(os.path.join(copy, READBACK), "w") as f:
        json.dump(rb, f)
    r = _pidctl("chaos", "check", copy, "-o", "json")
    assert r.returncode == 5, (r.returncode, r.stderr)
    d = json.loads(r.stdout)
    assert d["anomaly_counts"]["lost-write"] == 1 and d["anomaly_counts"]["torn-transaction"] <= 1
    assert d["anomalies"]["lost-write"][0]["value"] == victim[2]
    r = _pidctl("chaos", "check", copy)
    assert r.returncode == 5 and "INVALID" in r.stdout and "lost-write" in r.stdout


def _check_refuses_an_unfinished_transactions_run(out, tmp_path):
    copy = tmp_path / "unfinished"
    copy.mkdir()
    shutil.copy(os.path.join(out, RUN), copy / RUN)
    shutil.copy(os.path.join(out, HISTORY), copy / HISTORY)
    with pytest.raises(RunError, match="did not finish"):
        check_dir(str(copy), write=False)
    r = _pidctl("chaos", "check", str(copy))
    assert r.returncode == 1 and "did not finish" in r.stderr and "Traceback" not in r.stderr


def test_the_schedule_is_the_seed_s_and_ends_healed_within_the_duration():
    cfg = TxnRunConfig(duration_s=300, seed=5)
    a, b = schedule(cfg), schedule(TxnRunConfig(duration_s=300, seed=5))
    assert a == b and a != schedule(TxnRunConfig(duration_s=300, seed=6))
    assert len(a) >= 10 and {e["fault"] for e in a} == set(FAULTS)
    for prev, e in zip([None, *a], a):
        assert e["at_s"] + START_S.get(e["fault"], 0) + e["hold_s"] <= 300
        assert prev is None or e["at_s"] >= (prev["at_s"] + START_S.get(prev["fault"], 0) + prev["hold_s"]
                                             + cfg.interval_s[0] - 1e-6)
        if e["fault"] in ("pause-leader", "pause-node", "pause-broker-peer"):
            assert 2.0 <= e["hold_s"] <= 8.0
        if e["fault"] == "fence":
            assert e["hold_s"] == 0
    only = schedule(TxnRunConfig(duration_s=60, seed=1, faults=("kill-broker",)))
    assert only and {e["fault"] for e in only} == {"kill-broker"}
    with pytest.raises(RunError, match="unknown fault"):
        schedule(TxnRunConfig(faults=("meteor",)))


def test_without_the_kafka_clients_a_transactions_run_says_which_extra_to_install(monkeypatch, tmp_path):
    """The clients a transactions run drives are the `chaos` extra, not the wheel's requirements."""
    real = cli.chaos.importlib.util.find_spec
    monkeypatch.setattr(cli.chaos.importlib.util, "find_spec",
                        lambda name, *a: None if name == "confluent_kafka" else real(name, *a))
    r = CliRunner().invoke(pidctl, ["chaos", "run", "--workload", "transactions", "--duration", "10",
                                    "--out", str(tmp_path / "run")])
    assert r.exit_code != 0 and "pip install 'pidquorum[chaos]'" in r.output and "confluent_kafka" in r.output
    assert not (tmp_path / "run").exists()
