"""The transaction workload of the deterministic simulation (chaos.sim.txn): it replays exactly, passes on
fixed seeds, finds the late-step defect a switch puts back (tests/support/defects.py) within a few seeds,
and its model partitions and checker judge what they must."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from chaos.sim.campaign import run_campaign
from chaos.sim.checker import Violation
from chaos.sim.run import make_simulation
from chaos.sim.sim import SimConfig
from chaos.sim.txn_checker import TxnChecker
from chaos.sim.txn_log import ModelPartition
from cli.main import cli
from tests.chaos.sim_support import ROOT, quiet_logging  # noqa: F401 (quiet_logging: an autouse fixture)
from tests.support.defects import SWITCHES
from records.wire.errors import Errors

STEPS = 8000


def _run(seed: int, steps: int = STEPS):
    return make_simulation(SimConfig(seed=seed, steps=steps, workload="transactions")).run()


# ------------------------------------------------------------------ replay
def test_a_transaction_seed_replays_bit_for_bit_in_this_process_and_another():
    a, b = _run(12, 5000), _run(12, 5000)
    assert (a.digest, a.steps, a.trace, a.stats) == (b.digest, b.steps, b.trace, b.stats)
    assert a.stats["transactions"] > 10
    code = ("import logging; logging.disable(logging.CRITICAL); from chaos.sim.run import simulate; "
            "r = simulate(12, steps=5000, workload='transactions'); print(r.digest, r.steps)")
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout.strip()
    assert out == f"{a.digest} {a.steps}"


# -------------------------------------------------------------- fixed seeds
@pytest.mark.parametrize("first", [1, 11])
def test_fixed_transaction_seeds(first, record_property):
    result = run_campaign(list(range(first, first + 10)), STEPS, 3, 1, workload="transactions")
    failures = [f"seed {f.seed} step {f.step}: {f.violation}\n  replay: {f.replay}\n    " + "\n    ".join(f.trace[-15:])
                for f in result.failures]
    assert not failures, "\n".join(failures)
    record_property("transactions", f"{result.transactions} ({result.txn_committed} committed, {result.txn_aborted} "
                                     f"aborted, {result.txn_unknown} unknown), {result.late_copies} late copies")
    assert result.transactions > 150 and result.txn_committed > 50 and result.txn_aborted > 20
    assert result.late_copies > 10  # the path by which a step reaches the quorum late is exercised
    assert result.faults_by_kind["pause"] > 10 and result.faults_by_kind["broker_crash"] > 0


# Seeds of the first campaign (500000..500999, 12,000 events) that failed (docs/simulation.md, section 7): two
# InitProducerId calls sharing one request id (500000 ...), a late step naming no transaction (500008, 500118),
# a late answer reopening a transaction for the KIP-890 check (500818).  They pass now.
CAMPAIGN_SEEDS = [500000, 500007, 500038, 500057, 500105, 500008, 500118, 500818]


def test_seeds_the_first_transaction_campaign_failed_pass():
    failures = [f"seed {seed}: {r.violation}" for seed in CAMPAIGN_SEEDS if not (r := _run(seed, 12000)).ok]
    assert not failures, "\n".join(failures)


# Issue 39's campaign (1..300 with per-seed batch limits and large records): 288, a follower's conflicting tail
# never reached (the members did not converge); 290, an entry sent in pieces reassembled without its start.
ISSUE_39_SEEDS = [288, 290]


def test_seeds_issue_39s_campaign_failed_pass():
    failures = [f"seed {seed}: {r.violation}" for seed in ISSUE_39_SEEDS if not (r := _run(seed, 6000)).ok]
    assert not failures, "\n".join(failures)


def test_seed_510431_a_stale_leaders_batch_is_not_committed():
    result = _run(510431, 8000)
    assert result.ok, result.violation


def test_seed_513877_a_stale_completion_writes_no_marker_into_the_next_transaction():
    result = _run(513877, 8000)
    assert result.ok, result.violation


# --------------------------------------------------------------- it can fail
TXN_FOUND = 40  # seeds the simulation is given (seed 9 found it when measured: 4 of the first 24 seeds at 8,000 events)


def test_the_transaction_simulation_finds_steps_applied_to_the_next_transaction(record_property):
    t0 = time.perf_counter()
    with SWITCHES["txn-step-names-no-transaction"]():
        for seed in range(1, TXN_FOUND + 1):
            result = _run(seed)
            if not result.ok:
                record_property("seeds_to_find", f"{seed} seeds, {time.perf_counter() - t0:.1f}s: {result.violation}")
                assert "anomaly" in result.violation or "liveness" in result.violation
                return
    pytest.fail(f"no violation in {TXN_FOUND} seeds")


# ------------------------------------------------------------ the partitions
def test_a_model_partition_keeps_open_transactions_below_the_lso_and_hides_aborted_ones():
    part = ModelPartition("t", 0)
    assert part.append(7, 0, "a.1", None)[0] == Errors.INVALID_TXN_STATE  # KIP-890: not verified
    token = part.expect_transaction(7, 0)
    assert part.append(7, 0, "a.1", token) == (Errors.NONE, "", 0)
    t8 = part.expect_transaction(8, 0)
    part.append(8, 0, "b.1", t8)
    assert part.last_stable_offset == 0 and part.read_committed() == []
    assert [e.value for e in part.read_uncommitted()] == ["a.1", "b.1"]
    assert part.write_marker(7, 0, commit=False).error == Errors.NONE
    assert part.last_stable_offset == 1  # producer 8's transaction is still open from offset 1
    assert part.write_marker(8, 0, commit=True).base_offset == 3
    assert [e.value for e in part.read_committed()] == ["b.1"]
    assert part.write_marker(8, 0, commit=True).duplicate  # nothing open: a retried marker writes nothing
    assert part.write_marker(7, 0, commit=True).duplicate
    assert part.write_marker(8, 1, commit=False).base_offset == 4  # an epoch bump is written
    assert part.write_marker(8, 0, commit=True).error == Errors.INVALID_PRODUCER_EPOCH
    t7 = part.expect_transaction(7, 0)
    part.write_marker(7, 0, commit=True)  # a marker voids a KIP-890 check under way
    assert part.append(7, 0, "a.2", t7)[0] == Errors.INVALID_TXN_STATE


def _checker_with(partitions):
    sim = SimpleNamespace(clock=SimpleNamespace(now=0.0),
                          txn_brokers=[SimpleNamespace(storage=SimpleNamespace(all=lambda: partitions))])
    return TxnChecker(sim)


def _txn(checker, part, value, pid=7, commit=None, outcome=None):
    txn = checker.begin("tx", "tx#1", pid, 0, part.topic)
    checker.sent(txn, value)
    part.append(pid, 0, value, part.expect_transaction(pid, 0))
    txn.acked[part.name] = [value]
    if commit is not None:
        checker.ask(txn, "commit" if commit else "abort")
    txn.outcome = outcome
    return txn


@pytest.mark.parametrize("case, anomaly", [
    ("aborted read", "aborted read, G1a"),
    ("read before commit", "read before commit"),
    ("lost write", "lost write"),
    ("torn", "torn transaction"),
    ("hanging", "hanging transaction"),
    ("own-epoch abort of an open transaction", "LSO past an open transaction"),
])
def test_the_checker_names_each_anomaly(case, anomaly):
    p0, p1 = ModelPartition("t", 0), ModelPartition("t", 1)
    checker = _checker_with([p0, p1])
    if case == "aborted read":
        _txn(checker, p0, "tx#1.1", commit=False, outcome="aborted")
        p0.write_marker(7, 0, commit=True)  # the abort was answered OK, yet a COMMIT marker was written
    elif case == "read before commit":
        _txn(checker, p0, "tx#1.1")
        p0.write_marker(7, 0, commit=True)
    elif case == "lost write":
        _txn(checker, p0, "tx#1.1", commit=True, outcome="committed")
        p0.write_marker(7, 0, commit=False)
    elif case == "torn":
        txn = _txn(checker, p0, "tx#1.1", commit=True, outcome="unknown")
        checker.sent(txn, "tx#1.2")
        p1.append(7, 0, "tx#1.2", p1.expect_transaction(7, 0))
        txn.acked[p1.name] = ["tx#1.2"]
        p0.write_marker(7, 0, commit=True)
        p1.write_marker(7, 0, commit=False)
    elif case == "hanging":
        _txn(checker, p0, "tx#1.1", commit=True, outcome="unknown")
    else:
        _txn(checker, p0, "tx#1.1")
        p0.write_marker(7, 0, commit=False)  # an abort of its own epoch: neither a timeout nor fencing
    with pytest.raises(Violation, match=anomaly):
        checker.final()


def test_the_checker_passes_a_clean_history():
    p0 = ModelPartition("t", 0)
    checker = _checker_with([p0])
    _txn(checker, p0, "tx#1.1", commit=True, outcome="committed")
    p0.write_marker(7, 0, commit=True)
    _txn(checker, p0, "tx#1.2", commit=False, outcome="aborted")
    p0.write_marker(7, 0, commit=False)
    timed_out = _txn(checker, p0, "tx#1.3")
    p0.write_marker(7, 1, commit=False)  # the coordinator's timeout abort bumps the epoch
    checker.final()
    assert timed_out.outcome is None


# ----------------------------------------------------------------- the CLI
def test_cli_simulate_runs_the_transaction_workload(tmp_path):
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "5", "--steps", "3000", "--jobs", "1",
                                      "--workload", "transactions", "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["workload"] == "transactions" and figures["failed"] == 0 and figures["transactions"] > 5


def test_cli_prints_a_replay_command_with_the_workload():
    # Seeds 1..12 are where the switch is found: seeds 9 and 12 fail with it (and 23, 24 of the first 24) at
    # 8,000 events; a change to the schedule moves them (1..6 found it until the per-seed traffic moved them).
    with SWITCHES["txn-step-names-no-transaction"]():
        result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "1..12", "--steps", str(STEPS), "--jobs", "1",
                                          "--workload", "transactions"])
    assert result.exit_code == 5, result.output
    assert f"--steps {STEPS} --nodes 3 --workload transactions --trace" in result.output
