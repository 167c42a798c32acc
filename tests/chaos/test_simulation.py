"""The deterministic simulation and the crash-state explorer (chaos.sim): they replay exactly, they pass on
fixed and fresh seeds, and they find every defect a switch puts back (tests/support/defects.py) within
the suite's budget."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from chaos.sim.campaign import parse_seeds, run_campaign
from chaos.sim.explore import explore
from chaos.sim.sim import SimConfig, Simulation
from cli.main import cli
from tests.chaos.sim_support import ROOT, first_violation, quiet_logging  # noqa: F401 (quiet_logging: an autouse fixture)
from tests.support.defects import SWITCHES

STEPS = 4000


def _failures(seeds, steps=STEPS, nodes=3, jobs=1):
    result = run_campaign(seeds, steps, nodes, jobs)
    return result, [f"seed {f.seed} step {f.step}: {f.violation}\n  replay: {f.replay}\n    "
                    + "\n    ".join(f.trace[-15:]) for f in result.failures]


# ------------------------------------------------------------------ replay
def test_a_seed_replays_bit_for_bit_in_this_process():
    a = Simulation(SimConfig(seed=17, steps=3000)).run()
    b = Simulation(SimConfig(seed=17, steps=3000)).run()
    assert (a.digest, a.steps, a.trace, a.stats) == (b.digest, b.steps, b.trace, b.stats)
    assert Simulation(SimConfig(seed=18, steps=3000)).run().digest != a.digest


def test_a_seed_replays_bit_for_bit_in_other_processes_whatever_their_hash_seed():
    code = ("import logging; logging.disable(logging.CRITICAL); from chaos.sim.run import simulate; "
            "r = simulate(23, steps=2500); print(r.digest, r.steps)")
    outs = set()
    for hash_seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outs.add(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                                check=True, timeout=120).stdout.strip())
    here = Simulation(SimConfig(seed=23, steps=2500)).run()
    assert outs == {f"{here.digest} {here.steps}"}


# -------------------------------------------------------------- fixed seeds
@pytest.mark.parametrize("first", range(1, 121, 20))
def test_fixed_seeds_three_nodes(first):
    result, failures = _failures(list(range(first, first + 20)))
    assert not failures, "\n".join(failures)
    assert result.acked > 100 and result.faults > 20


@pytest.mark.parametrize("first", range(1, 31, 15))
def test_fixed_seeds_five_nodes(first):
    result, failures = _failures(list(range(first, first + 15)), nodes=5)
    assert not failures, "\n".join(failures)


# Seeds the second 10,000-seed campaign failed (6,000 events each), none on safety: 22 had a held-back
# follower stuck in a higher term than the leader's; 6 had a member whose view, from an uncommitted change in
# its log, lacked the leader (pysyncobj dropped the leader's traffic).  A later campaign (400000-400399) failed
# 400136: a snapshot recorded the configuration with a change after its index, so the restarted node never knew
# the leader (``members_at``).  420719 and 421720: a node never heard a member its log did not list yet (links
# between nodes that list each other only); the network's new link rule moved their schedules, so the mechanism's
# own test is ``tests/quorum/test_outside_peers.py``.  All must converge now.
CAMPAIGN_SEEDS = [100344, 101645, 101772, 101996, 102068, 102840, 103350, 103605, 103891, 103942, 103944, 104431,
                  104509, 104651, 105201, 105208, 105589, 106373, 106592, 106646, 107281, 107379, 107603, 108370,
                  108434, 109358, 109605, 109696, 400136, 420719, 421720,
                  # Issue 39's campaign (per-seed batch limits and large records): 332 and 931, an entry sent in
                  # pieces whose last two say "finish" (the follower unpickled a cut entry and stopped); 700, a
                  # follower's conflicting tail never reached (the leader's next index put back up by a later
                  # batch's refusal each round: the commit bound missed).
                  332, 700, 931,
                  1491,  # a piece of an entry without its start (appended to an empty str: the node stopped)
                  2137]  # entries a killed leader left unsynced counted durable on restart: lost, a target never reached


@pytest.mark.parametrize("part", range(4))
def test_seeds_the_campaign_found_converge(part):
    seeds = CAMPAIGN_SEEDS[part::4]
    failures = [f"seed {seed}: {r.violation}" for seed in seeds
                if not (r := Simulation(SimConfig(seed=seed, steps=6000)).run()).ok]
    assert not failures, "\n".join(failures)


def _restore_from_before_a_change_when_possible(self) -> None:
    """``Simulation._fault_restore_backup`` that restores a backup taken before the last membership change
    whenever one exists (the simulation itself does half the times it could)."""
    pool = self.backups_before_change or self.backups
    candidates = [i for i in pool if not self.nodes[i].removed and self.nodes[i].running]
    if not candidates:
        if self.rng.random() < 0.5:
            self._restore_while_a_member_lags()
        return
    i = self.rng.choice(candidates)
    if self._may_restore(self.nodes[i]):
        self._restore(self.nodes[i], pool)


# Seeds of a stress run (600 seeds, 470000-470599: membership changes and restores at least 0.3 and 0.4 a
# simulated second, every restore that can be from a backup taken before the last membership change) that did
# not converge: the member added last held the only full log, and the two others neither listed it nor voted
# for it.  All 600 pass now, 58 restores across a membership change among them.
STRESS_SEEDS = [470002, 470113, 470324]


@pytest.mark.parametrize("seed", STRESS_SEEDS)
def test_restores_of_backups_from_before_a_membership_change_converge(seed, monkeypatch):
    monkeypatch.setattr(Simulation, "_fault_restore_backup", _restore_from_before_a_change_when_possible)
    sim = Simulation(SimConfig(seed=seed, steps=6000))
    sim.plan.membership = max(sim.plan.membership, 0.3)
    sim.plan.restore_backup = max(sim.plan.restore_backup, 0.4)
    result = sim.run()
    assert result.ok, result.violation


def test_fresh_seeds(record_property):
    """A few seeds never run before, printed in the test summary: a failure here replays with its seed."""
    seeds = [random.SystemRandom().randrange(10**6, 10**9) for _ in range(8)]
    record_property("fresh_simulation_seeds", ",".join(map(str, seeds)))
    result, failures = _failures(seeds)
    assert not failures, "\n".join(failures)


# --------------------------------------------------------- it can fail
SIM_FOUND = {  # switch -> seeds the simulation is given to find it (it took 1 to 165 when measured; a change
    # to the workload moves each figure: install-not-synced went from seed 41 to 78 when requests became
    # the bodies clients send)
    "install-not-synced": 200,
    "failed-sync-ignored": 300,
    "restored-backup-accepted": 60,
    "commit-from-unverified-message": 60,
    "truncate-after-prev-index": 500,
    "kafka-15552-seed-at-block-start": 10,
    "kafka-20031-less-than-for-at-most": 60,
}


@pytest.mark.parametrize("switch", sorted(SIM_FOUND))
def test_the_simulation_finds_each_reintroduced_defect(switch, record_property):
    t0 = time.perf_counter()
    found = first_violation(switch, SIM_FOUND[switch], lambda seed: Simulation(SimConfig(seed=seed, steps=STEPS)).run())
    if found is None:
        pytest.fail(f"{switch}: no violation in {SIM_FOUND[switch]} seeds")
    record_property("seeds_to_find", f"{switch}: {found[0]} seeds, {time.perf_counter() - t0:.1f}s")


def test_the_crash_state_explorer_finds_a_journal_cleared_on_mismatch(record_property):
    """Defect 1 needs a power cut exactly between a durable snapshot and the journal's rewrite: the
    explorer's job (a random fault rarely lands there)."""
    with SWITCHES["journal-cleared-on-mismatch"]():
        result = explore(seed=1, steps=3000, nodes=[2], around="raft.snapshot", reach=4, jobs=1)
    record_property("explorer_found", f"{len(result.failures)} of {result.states} crash states")
    assert result.failures and "lost entry" in result.failures[0].violation


def test_the_crash_state_explorer_finds_an_install_that_is_not_synced():
    with SWITCHES["install-not-synced"]():
        result = explore(seed=1, steps=3000, nodes=[2], around="raft.snapshot", reach=4, jobs=1)
    assert result.failures


def test_every_crash_state_around_compactions_and_installs_is_safe(record_property):
    result = explore(seed=1, steps=3000, nodes=[2, 3], around="raft.snapshot", reach=3, jobs=1)
    record_property("crash_states", f"{result.states} states at {result.ops} file operations")
    assert result.recording_ok, result.recording_violation
    assert not result.failures, "\n".join(f"{f.op} {f.state}: {f.violation}" for f in result.failures)
    assert result.states > 200


def test_crash_states_of_identity_and_peers_writes_are_safe():
    result = explore(seed=2, steps=3000, nodes=[3], around="identity", reach=6, jobs=1)
    assert result.states > 20 and not result.failures, [f.violation for f in result.failures]


# ----------------------------------------------------------------- the CLI
def test_cli_simulate_reports_figures_and_exits_0_when_clean(tmp_path):
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "3..4", "--steps", "1500", "--jobs", "1",
                                      "--json", str(out), "-o", "json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert figures["seeds"] == 2 and figures["failed"] == 0 and figures["steps"] >= 3000
    assert figures["simulated_hours_per_wall_minute"] > 0 and figures["faults"] >= 0
    assert json.loads(result.output[result.output.index("{"):]) == figures
    assert set(figures["traffic"]) == set(TRAFFIC)  # summed over the seeds; the seed's settings left out
    assert figures["traffic"]["append_entries"] > 0


TRAFFIC = ("append_entries", "append_entries_split", "append_entries_commit_beyond", "installs",
           "installs_on_conflict", "installs_over_tail", "trust_own_log_restarts")


def test_cli_simulate_shows_the_traffic_the_seeds_reached():
    result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "3", "--steps", "1500", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    table = lines[lines.index("traffic"):]
    first_cells = {line.split("│")[1].strip() for line in table if line.count("│") == 3}
    assert set(TRAFFIC) <= first_cells, result.output


def test_cli_simulate_prints_the_replay_command_and_exits_5_on_a_violation():
    with SWITCHES["kafka-15552-seed-at-block-start"]():
        result = CliRunner().invoke(cli, ["chaos", "simulate", "--seeds", "1", "--steps", "2500", "--jobs", "1",
                                          "--trace"])
    assert result.exit_code == 5, result.output
    assert "replay: pidctl chaos simulate --seeds 1 --steps 2500 --nodes 3 --trace" in result.output
    assert "issued twice" in result.output


def test_cli_crash_states(tmp_path):
    result = CliRunner().invoke(cli, ["chaos", "crash-states", "--node", "2", "--max-ops", "4", "--jobs", "1",
                                      "-o", "json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output[result.output.index("{"):])
    assert figures["ops"] == 4 and figures["crash_states"] >= 4 and figures["failed"] == 0


@pytest.mark.parametrize("text, seeds", [("3..5", [3, 4, 5]), ("7", [7]), ("1,9, 4", [1, 9, 4])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["5..2", "a..b", "x", "1..", ""])
def test_bad_seeds_are_refused(text):
    if text == "":
        assert parse_seeds(text) == []
        return
    with pytest.raises(ValueError, match="seeds must be"):
        parse_seeds(text)
