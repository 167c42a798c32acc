"""The simulation judges liveness (chaos.sim.liveness): after the last fault heals, a leader that a majority
follows within the leader bound and a client request committed within the commit bound, or the seed fails;
the times after every heal are figures of ``pidctl chaos simulate``; and a vote denial without its term
(tests/support/defects.py) is found within the suite's budget."""
from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from chaos.sim import liveness
from chaos.sim.sim import SimConfig, Simulation
from cli.main import cli
from tests.chaos.sim_support import quiet_logging  # noqa: F401 (quiet_logging: an autouse fixture)
from tests.support.defects import SWITCHES

STEPS = 3000
SWITCH_SEEDS = 80  # seeds the simulation is given to find the switch (see the test)


def _ends_held_above_candidate(monkeypatch) -> None:
    """Every seed ends with ``_candidate_below_held_back`` (a fifth of them do by themselves)."""
    monkeypatch.setattr(Simulation, "HELD_ABOVE_CANDIDATE", 1.0)


# ------------------------------------------------------------ it can fail
def test_the_simulation_finds_a_vote_denial_without_its_term(record_property, capsys):
    """With the switch, a candidate below the held-back nodes' term climbs one term per election timeout;
    a seed whose last fault leaves it there misses the leader bound."""
    t0 = time.perf_counter()
    with SWITCHES["vote-denial-term-ignored"]():
        for seed in range(1, SWITCH_SEEDS + 1):
            result = Simulation(SimConfig(seed=seed, steps=STEPS)).run()
            if not result.ok:
                break
        else:
            pytest.fail(f"vote-denial-term-ignored: no violation in {SWITCH_SEEDS} seeds")
    took = f"vote-denial-term-ignored: found by seed {seed} ({seed} seeds, {time.perf_counter() - t0:.1f}s)"
    record_property("seeds_to_find", took)
    with capsys.disabled():
        print(f"\n{took}")
    assert result.violation.startswith("liveness: no leader that a majority follows 5 simulated seconds after "
                                       "the last fault healed (the leader bound): node "), result.violation
    assert "held back" in result.violation
    # The same seed without the switch: a leader within a second of the heal.
    clean = Simulation(SimConfig(seed=seed, steps=STEPS)).run()
    assert clean.ok, clean.violation
    assert clean.stats["liveness"]["leader_after_heal"] < 1.5


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_candidate_below_held_back_nodes_learns_their_term_from_a_denial(seed, monkeypatch):
    """The last fault's shape, on every seed: without the switch the cut-off leader leads again within the
    leader bound; with it, it stays below the others' term past the bound."""
    _ends_held_above_candidate(monkeypatch)
    result = Simulation(SimConfig(seed=seed, steps=STEPS)).run()
    assert result.ok, result.violation
    assert result.stats["faults_by_kind"].get("partition_leader_below_held_back") == 1
    assert result.stats["liveness"]["leader_after_heal"] < liveness.LEADER_BOUND
    with SWITCHES["vote-denial-term-ignored"]():
        stuck = Simulation(SimConfig(seed=seed, steps=STEPS)).run()
    assert not stuck.ok and "(the leader bound)" in stuck.violation, stuck.violation


def test_the_last_fault_replays_bit_for_bit(monkeypatch):
    _ends_held_above_candidate(monkeypatch)
    a = Simulation(SimConfig(seed=5, steps=STEPS)).run()
    b = Simulation(SimConfig(seed=5, steps=STEPS)).run()
    assert a.ok, a.violation
    assert (a.digest, a.steps, a.trace, a.stats) == (b.digest, b.steps, b.trace, b.stats)
    assert any("last fault: the leader" in line for line in a.trace)


def test_no_committed_request_within_the_commit_bound_is_a_failure(monkeypatch):
    """A quorum that elects but answers no client: the request after the last heal never returns."""
    monkeypatch.setattr(Simulation, "HELD_ABOVE_CANDIDATE", 0.0)
    monkeypatch.setattr(Simulation, "_probe", lambda self, healed: None)
    result = Simulation(SimConfig(seed=4, steps=1500)).run()
    assert not result.ok
    assert result.violation.startswith("liveness: no client request committed 10 simulated seconds after the "
                                       "last fault healed (the commit bound; a leader after "), result.violation
    assert "node 1: " in result.violation and "node 2: " in result.violation


# ----------------------------------------------------------------- figures
def test_a_clean_seed_reports_its_liveness_figures():
    result = Simulation(SimConfig(seed=3, steps=4000)).run()
    assert result.ok, result.violation
    live = result.stats["liveness"]
    assert 0 <= live["leader_after_heal"] <= live["commit_after_heal"] < liveness.COMMIT_BOUND
    assert live["heals"] >= live["heals_with_leader"] + len(live["leader_after_mid_run_heal"])
    assert live["leader_after_mid_run_heal"] and all(t >= 0 for t in live["leader_after_mid_run_heal"])


def test_without_faults_a_leader_is_there_at_the_heal():
    result = Simulation(SimConfig(seed=9, steps=1500, faults=False)).run()
    assert result.ok, result.violation
    live = result.stats["liveness"]
    assert live["leader_after_heal"] == 0.0 and live["heals"] == 0 and live["commit_after_heal"] < 1.0


@pytest.mark.parametrize("values, expected", [
    ([], {"count": 0, "median": None, "p99": None, "max": None}),
    ([0.5], {"count": 1, "median": 0.5, "p99": 0.5, "max": 0.5}),
    ([3.0, 1.0, 2.0, 4.0], {"count": 4, "median": 2.5, "p99": 4.0, "max": 4.0}),
    (list(range(1, 201)), {"count": 200, "median": 100.5, "p99": 198, "max": 200}),
])
def test_summary(values, expected):
    assert liveness.summary(values) == expected


def test_cli_reports_liveness_figures(tmp_path):
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "3..4", "--steps", "1500", "--jobs", "1",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # an 80-column console wraps the table's cells
    assert "liveness (simulated seconds)" in text
    assert "│ commit │ last heal │ 2 │" in text and "a client request committed" in text, result.output
    live = json.loads(out.read_text())["liveness"]
    assert live["leader_after_last_heal_s"]["count"] == 2 and live["commit_after_last_heal_s"]["count"] == 2
    assert 0 <= live["commit_after_last_heal_s"]["median"] <= live["commit_after_last_heal_s"]["max"]
    assert set(live["leader_after_mid_run_heal_s"]) == {"count", "median", "p99", "max"}
    assert "leader_after_heal" not in json.loads(out.read_text())  # summarized, not one figure per seed


def test_cli_exits_5_with_the_missed_bound_and_the_replay_command(monkeypatch):
    _ends_held_above_candidate(monkeypatch)
    with SWITCHES["vote-denial-term-ignored"]():
        result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "2", "--steps", str(STEPS), "--jobs", "1"])
    assert result.exit_code == 5, result.output
    text = " ".join(result.output.split())  # the console wraps long lines
    assert "error: seed 2, step " in text
    assert "liveness: no leader that a majority follows 5 simulated seconds after the last fault healed" in text
    assert f"replay: pidctl chaos simulate --seeds 2 --steps {STEPS} --nodes 3 --trace" in text
