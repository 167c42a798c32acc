"""``pidctl bench transactions``: a short run end to end (a real quorum, a broker, librdkafka producers, one
leader kill), in a subprocess with a deadline; the JSON has every figure and the exactly-once check found
nothing lost or duplicated.  The checker itself is tested on made-up read-backs.

Figures are not compared with anything (a benchmark is not a timed test); that they exist is asserted.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from benchmarks import transactions
from benchmarks.processes import REPO, child_env

DEADLINE_S = 120  # the run takes ~25 s; a hang fails the test instead of holding the suite


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("transactions")
    cmd = [sys.executable, "-m", "benchmarks.transactions", "--quick", "--duration", "4", "--kill-every", "1.5",
           "--out", str(out), "-o", "json"]
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
    k = res["phases"]["leader_kill"]
    for key in ("kills", "rounds", "outcomes", "measured_committed", "transactions_per_s", "commit",
                "longest_gap_between_commits_ms", "producer_instances", "failed_transactions", "check"):
        assert key in k, key
    assert k["kills"] == len(k["rounds"]) >= 1 and k["measured_committed"] > 0
    c = k["check"]
    assert c["lost"] == 0 and c["duplicated"] == 0, c["examples"]
    assert c["aborted_visible"] == c["partial"] == c["foreign"] == 0, c["examples"]
    assert c["committed"] == k["outcomes"]["committed"] and c["transactions_seen"] >= c["committed"]


def test_the_table_prints_every_section(run, capsys):
    transactions.print_results(run[3])
    text = capsys.readouterr().out
    for label in ("1-2. one producer", "commit_transaction() / flush() p99 ms", "tx / idem",
                  "3. transactions with the quorum leader SIGKILLed", "lost (committed, not seen whole)",
                  "exactly-once: OK", "all checks passed"):
        assert label in text, label


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
