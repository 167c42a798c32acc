"""``pidctl bench transactions``: a short run end to end (a real quorum, a broker, librdkafka producers, one
leader kill), in a subprocess with a deadline; the JSON has every figure and the exactly-once check found
nothing lost or duplicated.  A short sweep (two cells) likewise.  The checker and the targets table are
tested on made-up read-backs and results.

Figures are not compared with anything (a benchmark is not a timed test); that they exist is asserted.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from benchmarks import transactions, txn_init_burst, txn_sweep, txn_targets
from benchmarks.processes import REPO, child_env

DEADLINE_S = 120  # the run takes ~25 s (the sweep ~15 s); a hang fails the test instead of holding the suite


def _bench(out, *args: str):
    """``python -m benchmarks.transactions ARGS --out OUT -o json`` with a deadline: exit code, stdout,
    stderr and the JSON written."""
    cmd = [sys.executable, "-m", "benchmarks.transactions", *args, "--out", str(out), "-o", "json"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # its finally blocks take the cluster and the broker down
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"the benchmark did not finish within {DEADLINE_S} s:\n{stderr[-3000:]}")
    return proc.returncode, stdout, stderr, json.loads((out / "transactions.json").read_text())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _bench(tmp_path_factory.mktemp("transactions"), "--quick", "--duration", "4", "--kill-every", "1.5")


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    return _bench(tmp_path_factory.mktemp("transactions-sweep"), "--quick", "--phases", "sweep",
                  "--sweep-cells", "1x1,3x10", "--sweep-seconds", "0.5")


def test_the_json_has_every_figure_and_nothing_lost_or_duplicated(run):
    code, stdout, stderr, res = run
    assert code == 0, (code, res["errors"], res["failed_checks"], stderr[-3000:])
    assert json.loads(stdout) == res  # -o json prints what was written
    assert res["errors"] == [] and res["failed_checks"] == []
    assert list(res["phases"]) == ["setup", "steady", "leader_kill"]
    env = res["environment"]
    assert env["cpu_count"] >= 1 and env["librdkafka"] and env["confluent_kafka"] and env["kafka_python"]
    s = res["phases"]["steady"]
    t, i = s["transactional"], s["idempotent"]
    for key in ("transactions_per_s", "messages_per_s", "commit", "unit", "init_transactions", "check"):
        assert key in t, key
    for key in ("units_per_s", "messages_per_s", "flush", "unit", "check"):
        assert key in i, key
    for q in ("p50_ms", "p99_ms", "max_ms"):
        assert t["commit"][q] is not None and i["flush"][q] is not None
    assert set(s["ratio_transactional_over_idempotent"]) == {"per_s", "latency_p50_ms", "latency_p99_ms",
                                                              "latency_max_ms"}
    for c in (t["check"], i["check"]):
        assert c["lost"] == c["duplicated"] == 0 and c["read_complete"] and c["settle"]["settled"]
    w = s["where_the_time_goes"]  # from the broker's step times over the transactional rounds
    assert w["transactions"] >= t["measured_committed"] > 0
    assert w["per_transaction_ms"]["add"] > 0 and w["per_transaction_ms"]["end"] > 0
    assert 0 < w["quorum_on_path_ms"] < w["commit_mean_ms"] and w["floor_over_flush"] > 0
    k = res["phases"]["leader_kill"]
    for key in ("kills", "rounds", "outcomes", "measured_committed", "transactions_per_s", "commit",
                "longest_gap_between_commits_ms", "producer_instances", "failed_transactions", "check"):
        assert key in k, key
    assert k["kills"] == len(k["rounds"]) >= 1 and k["measured_committed"] > 0
    c = k["check"]
    assert c["lost"] == 0 and c["duplicated"] == 0, c["examples"]
    assert c["aborted_visible"] == c["partial"] == c["foreign"] == 0, c["examples"]
    assert c["committed"] == k["outcomes"]["committed"] and c["transactions_seen"] >= c["committed"]
    targets = {r["id"]: r for r in res["targets"]}
    assert list(targets) == ["commit_p50", "commit_p99", "throughput", "leader_kill", "init_burst"]
    for tid in ("commit_p50", "commit_p99", "throughput"):
        assert targets[tid]["from"] == "steady" and isinstance(targets[tid]["met"], bool)
        assert targets[tid]["value"] is not None
    assert targets["leader_kill"]["met"] is True  # kills every 1.5 s, nothing lost or duplicated (asserted above)
    assert targets["init_burst"]["met"] is None and targets["init_burst"]["measured"] == "not run"


def test_the_table_prints_every_section(run, capsys):
    transactions.print_results(run[3])
    text = capsys.readouterr().out
    for label in ("1-2. one producer", "commit_transaction() / flush() p99 ms", "tx / idem",
                  "3. transactions with the quorum leader SIGKILLed", "lost (committed, not seen whole)",
                  "exactly-once: OK", "Targets (same run", "Kafka (published)", "Redpanda (published)",
                  "all checks passed"):
        assert label in text, label
    for s in txn_targets.SOURCES.values():
        assert s["url"] in text


def test_a_short_sweep_runs_each_cell_on_its_own_topics_and_reads_them_back_whole(sweep_run):
    code, stdout, stderr, res = sweep_run
    assert code == 0, (code, res["errors"], res["failed_checks"], stderr[-3000:])
    assert res["errors"] == [] and res["failed_checks"] == []
    assert list(res["phases"]) == ["setup", "sweep"]
    cells = res["phases"]["sweep"]["cells"]
    assert list(cells) == ["1x1", "3x10"]
    for name, (p, m) in {"1x1": (1, 1), "3x10": (3, 10)}.items():
        cell = cells[name]
        assert (cell["partitions"], cell["messages"]) == (p, m) and "error" not in cell
        t, i, r = cell["transactional"], cell["idempotent"], cell["ratio_transactional_over_idempotent"]
        assert t["measured_committed"] > 0 and i["measured_units"] > 0
        assert t["transactions_per_s"] > 0 and i["units_per_s"] > 0
        assert t["messages_per_s"] == pytest.approx(t["transactions_per_s"] * m)
        for q in ("p50_ms", "p99_ms"):
            assert t["commit"][q] > 0 and i["flush"][q] > 0 and r[f"latency_{q}"] > 0
        assert r["per_s"] > 0
        assert t["errors"] == {} and t["delivery_errors"] == {} and i["errors"] == {}
        for c in (t["check"], i["check"]):
            assert c["lost"] == c["duplicated"] == c["aborted_visible"] == c["partial"] == c["foreign"] == 0, \
                c["examples"]
            assert c["read_complete"] and c["settle"]["settled"]
            # the topic has the cell's partitions, each one written to (message i to partition i % p)
            assert sorted(int(k) for k in c["settle"]["high_watermarks"]) == list(range(p))
            assert all(v > 0 for v in c["settle"]["high_watermarks"].values())
        # every committed transaction read back whole: its m messages, no more
        assert t["check"]["records"] == t["check"]["committed"] * m == t["outcomes"]["committed"] * m
        assert i["check"]["records"] == i["check"]["committed"] * m
    targets = {r["id"]: r for r in res["targets"]}
    assert targets["commit_p50"]["from"] == "sweep 3x10"  # no steady phase: the 3x10 cell stands in
    assert isinstance(targets["throughput"]["met"], bool)
    assert targets["sweep_commit_p50"]["value"]["cells"] == 2
    assert targets["leader_kill"]["met"] is None


def test_the_sweep_table_prints_every_cell(sweep_run, capsys):
    transactions.print_results(sweep_run[3])
    text = capsys.readouterr().out
    for label in ("4. sweep", "tx/idem", "commit p99", "exactly-once: OK in every cell", "Targets (same run",
                  "every sweep cell", "all checks passed"):
        assert label in text, label
    lines = [ln.split() for ln in text.splitlines()]
    assert any(ln[:1] == ["1x1"] for ln in lines) and any(ln[:1] == ["3x10"] for ln in lines)


def test_sweep_cells_are_parsed_or_refused():
    assert txn_sweep.parse_cells("1x1, 3X10,1x1") == [(1, 1), (3, 10)]
    assert len(txn_sweep.parse_cells(txn_sweep.DEFAULT_CELLS)) == 9
    for bad in ("", "3", "3by10", "0x1", "1x0", "x10", "-1x2", "101x1"):
        with pytest.raises(ValueError):
            txn_sweep.parse_cells(bad)
    with pytest.raises(SystemExit):
        transactions.parse_args(["--sweep-cells", "3by10"])
    a = transactions.parse_args(["--quick", "--phases", "steady,sweep"])
    assert a.phases == ["steady", "sweep"] and a.sweep_seconds == 1.5 and len(a.sweep_cells) == 9
    assert transactions.parse_args([]).phases == ["steady", "leader_kill"]  # the sweep only when named


# ------------------------------------------------------------------ the targets table, no processes
def _lat(p50, p99):
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": p99}


def _comparison(commit, flush, tx_s, idem_s) -> dict:
    t = {"commit": _lat(*commit), "transactions_per_s": tx_s}
    i = {"flush": _lat(*flush), "units_per_s": idem_s}
    return {"transactional": t, "idempotent": i,
            "ratio_transactional_over_idempotent": {"per_s": tx_s / idem_s, "latency_p50_ms": commit[0] / flush[0],
                                                    "latency_p99_ms": commit[1] / flush[1],
                                                    "latency_max_ms": commit[1] / flush[1]}}


def _kills(lost=0, duplicated=0, aborted=0, kills=3, every=5.0, committed=100) -> dict:
    return {"check": {"lost": lost, "duplicated": duplicated, "aborted_visible": aborted, "read_complete": True,
                      "settle": {"settled": True}},
            "kills": kills, "kill_every_s": every, "measured_committed": committed}


def _targets(phases: dict) -> dict:
    return {r["id"]: r for r in txn_targets.evaluate({"phases": phases})}


def test_targets_met_not_met_and_not_run():
    none = _targets({})
    assert [r["met"] for r in none.values()] == [None] * 5
    assert all(r["measured"] == "not run" for r in none.values())

    good = _targets({"steady": _comparison((6, 9), (3, 4), 50, 100), "leader_kill": _kills(),
                     "init_burst": {"transactional_burst": {"latency": {"p50_ms": 10, "p99_ms": 40}},
                                    "idempotent_burst": {"latency": {"p50_ms": 5, "p99_ms": 20}}}})
    assert {k: r["met"] for k, r in good.items()} == {k: True for k in good}
    assert good["commit_p50"]["value"] == 2 and good["commit_p99"]["value"] == 2.25
    assert good["throughput"]["value"] == 0.5 and good["init_burst"]["value"] == 40
    assert "2.00x" in good["commit_p50"]["measured"] and "steady" in good["commit_p50"]["measured"]

    bad = _targets({"steady": _comparison((10, 40), (3, 10), 30, 100), "leader_kill": _kills(duplicated=1),
                    "init_burst": {"transactional_burst": {"latency": {"p50_ms": 30, "p99_ms": 60}},
                                   "idempotent_burst": {"latency": {}}}})
    assert {k: r["met"] for k, r in bad.items()} == {k: False for k in bad}
    assert bad["commit_p50"]["value"] == pytest.approx(10 / 3) and bad["throughput"]["value"] == 0.3

    # the leader_kill target needs its load: a kill at least every 5 s, one kill, one commit
    for kw in ({"every": 10.0}, {"kills": 0}, {"committed": 0}):
        r = _targets({"leader_kill": _kills(**kw)})["leader_kill"]
        assert r["met"] is False and "not the target's load" in r["measured"]
    # exactly at the limits is met
    edge = _targets({"steady": _comparison((9, 9), (3, 3), 40, 100)})
    assert edge["commit_p50"]["met"] and edge["commit_p99"]["met"] and edge["throughput"]["met"]


def test_targets_from_the_sweep_when_the_steady_phase_did_not_run():
    cells = {"1x1": _comparison((5, 20), (1, 2), 100, 1000), "3x10": _comparison((6, 9), (3, 4), 50, 100),
             "10x100": {"partitions": 10, "messages": 100, "error": "RuntimeError: x"}}
    t = _targets({"sweep": {"cells": cells}})
    assert t["commit_p50"]["from"] == "sweep 3x10" and t["commit_p50"]["met"] is True
    assert t["sweep_commit_p50"]["met"] is False  # 1x1 at 5x, and the failed cell counts against it
    assert t["sweep_commit_p50"]["value"]["within"] == 1 and t["sweep_commit_p50"]["value"]["cells"] == 3
    assert "worst 5.00x (1x1)" in t["sweep_commit_p50"]["measured"]
    assert _targets({"sweep": {"cells": {"1x1": cells["1x1"]}}})["commit_p50"]["met"] is None


def test_published_figures_name_their_sources_and_the_docs_list_them(capsys):
    for tid, figs in txn_targets.PUBLISHED.items():
        assert tid in txn_targets.TARGETS
        for f in figs.values():
            assert f is None or (f["source"] in txn_targets.SOURCES and f["figure"] and f["states"])
    for s in txn_targets.SOURCES.values():
        assert s["url"].startswith("https://") and s["title"] and s["by"] and s["date"] and s["setup"]
    with open(os.path.join(REPO, "docs", "benchmarks.md")) as fh:
        docs = fh.read()
    for s in txn_targets.SOURCES.values():
        assert s["url"] in docs, s["url"]
    txn_targets.print_targets(txn_targets.evaluate({"phases": {}}))
    text = capsys.readouterr().out
    assert text.count(txn_targets.NOT_FOUND) == 5  # commit p99 (2), leader kill (Kafka), init burst (2)
    assert "[1]" in text and "not run" in text


def rec(txn: int, *indexes: int, part: int = 0) -> list[tuple[int, int, bytes]]:
    return [(part, 0, transactions.value(txn, i)) for i in indexes]


def test_exactly_once_finds_lost_duplicated_aborted_and_partial():
    whole = range(transactions.MESSAGES)
    outcomes = {0: "committed", 1: "committed", 2: "committed", 3: "aborted", 4: "unknown", 5: "unknown",
                6: "unknown", 7: "abandoned"}
    records = (rec(0, *whole) + rec(1, *range(9)) + rec(2, *whole) + rec(2, 3) + rec(3, 0) + rec(4, *whole)
               + rec(5, 1, 2) + [(1, 9, b"not ours")])
    c = transactions.exactly_once(records, outcomes)
    assert (c["lost"], c["duplicated"], c["aborted_visible"], c["partial"], c["foreign"]) == (1, 1, 1, 1, 1)
    assert c["unknown_seen_committed"] == 1 and c["unknown_absent"] == 1
    assert [e["txn"] for e in c["examples"]["lost"]] == [1]
    assert c["examples"]["duplicated"][0]["txn"] == 2 and c["examples"]["duplicated"][0]["index"] == 3
    bad = {"phases": {"leader_kill": {"check": {**c, "settle": {"settled": True}, "read_complete": True},
                                      "transactional_id": "x", "kills": 1, "measured_committed": 2,
                                      "duration_s": 1, "kill_every_s": 1, "restart_after_s": 1}}}
    found = transactions.checks(bad)
    assert len(found) == 1 and found[0].startswith("FAIL leader_kill") and "lost 1, duplicated 1" in found[0]


def test_exactly_once_passes_a_clean_read_back():
    whole = range(transactions.MESSAGES)
    c = transactions.exactly_once(rec(0, *whole, part=1) + rec(2, *whole), {0: "committed", 1: "aborted",
                                                                             2: "unknown"})
    assert transactions.violations(c) == {} and c["unknown_seen_committed"] == 1


@pytest.fixture(scope="module")
def burst_run(tmp_path_factory):
    return _bench(tmp_path_factory.mktemp("transactions-burst"), "--phases", "init_burst", "--init-ids", "120",
                  "--init-brokers", "2", "--init-connections", "3")


def test_an_init_burst_over_two_brokers_gives_each_id_its_own_producer_id_and_bumps_it(burst_run, capsys):
    code, _, stderr, res = burst_run
    assert code == 0, (code, res["errors"], res["failed_checks"], stderr[-3000:])
    b = res["phases"]["init_burst"]
    assert (b["ids"], b["brokers"], b["connections_per_broker"]) == (120, 2, 3)
    for load in ("idempotent_burst", "transactional_burst", "transactional_bump_burst", "transactional_closed_loop"):
        assert b[load]["requests"] == b[load]["answered_ok"] == 120 and b[load]["errors"] == {}, load
        assert b[load]["latency"]["p99_ms"] > 0
    c = b["check"]
    assert c["transactional_pids"] == 240 and c["transactional_pids_shared"] == 0
    assert c["transactional_pids_also_idempotent"] == c["bumps_wrong"] == c["new_ids_not_epoch_0"] == 0
    row = {r["id"]: r for r in res["targets"]}["init_burst"]
    assert row["value"] == b["transactional_burst"]["latency"]["p99_ms"] and isinstance(row["met"], bool)
    transactions.print_results(res)
    text = capsys.readouterr().out
    assert "transactional epoch bumps, all at once" in text and "no quorum step: the floor" in text


def test_init_burst_checks_find_a_producer_id_given_twice_and_a_wrong_bump():
    class Load:
        def __init__(self, got):
            self.got = got
    loads = {"warm_up": Load({0: (1, 0)}), "idempotent_burst": Load({0: (2, 0)}),
             "transactional_burst": Load({0: (10, 0), 1: (11, 0)}),
             "transactional_bump_burst": Load({0: (10, 1), 1: (11, 1)}),
             "transactional_closed_loop": Load({0: (12, 0)})}
    assert txn_init_burst._check(loads)["transactional_pids_shared"] == 0
    loads["transactional_closed_loop"] = Load({0: (11, 0), 1: (2, 0)})  # 11 again, and an idempotent one
    loads["transactional_bump_burst"] = Load({0: (10, 2), 1: (12, 0)})
    c = txn_init_burst._check(loads)
    assert c["transactional_pids_shared"] == 1 and c["transactional_pids_also_idempotent"] == 1
    assert c["bumps_wrong"] == 2
    ph = {name: {"errors": {}} for name in ("idempotent_burst", "transactional_burst", "transactional_bump_burst",
                                            "transactional_closed_loop")}
    ph["check"] = c
    assert [m[:15] for m in txn_init_burst.checks(ph)] == ["FAIL init_burst"] * 2


def test_the_time_split_takes_the_step_times_grown_over_the_rounds():
    before = {"add": (5, 0.005), "end": (5, 0.005), "wait": (0, 0.0), "complete": (5, 0.01)}
    after = {"add": (105, 0.105), "end": (105, 0.125), "wait": (50, 0.01), "complete": (105, 0.21)}
    w = transactions.time_split(before, after, {"commit": {"mean_ms": 5.0}}, {"flush": {"mean_ms": 1.0}})
    assert w["transactions"] == 100
    assert w["per_transaction_ms"] == pytest.approx({"add": 1.0, "end": 1.2, "wait": 0.1, "complete": 2.0})
    assert w["quorum_on_path_ms"] == pytest.approx(2.3) and w["floor_over_flush"] == pytest.approx(2.7)
    assert transactions.time_split({}, after, {"commit": {"mean_ms": 5.0}}, {"flush": {"mean_ms": 1.0}}) is None
