"""``pidctl bench``: a short run on pidquorum alone (the JSON's shape), the peers when installed, bad options;
``pidctl bench NAME``: every benchmark of the package answers its own --help, and a short one runs.

The peers (ZooKeeper, etcd) are real Debian packages: their test is skipped when a package is missing,
never faked.  Figures are not asserted (a benchmark is not a timed test); shapes and checks are.
"""
from __future__ import annotations

import json
import math
import os

import pytest
from click.testing import CliRunner

from benchmarks.run import evaluate_targets, outage_of, throughput
from benchmarks.systems import missing_reason
from cli.bench import BENCHMARKS
from cli.common import EXIT_USAGE
from cli.main import cli


def invoke(*args, expect=0):
    result = CliRunner().invoke(cli, ["bench", *args])
    assert result.exit_code == expect, (result.exit_code, result.output, result.exception)
    return result


def test_bench_pidquorum_alone_writes_json_table_and_chart(tmp_path):
    out = tmp_path / "out"
    result = invoke("--systems", "pidquorum", "--duration", "2", "--kills", "1", "--history", "300",
                    "--fill-cap", "60", "--manager-rate", "5000", "--out", str(out))
    res = json.loads((out / "bench.json").read_text())
    assert set(res) >= {"params", "environment", "systems", "skipped", "errors", "load", "targets", "busy_warnings"}
    assert res["errors"] == [], res["errors"]
    assert list(res["systems"]) == ["pidquorum"] and res["skipped"] == {}
    pq = res["systems"]["pidquorum"]
    for key in ("w1", "w2"):
        w = pq[key]
        assert w["blocks"] > 0 and w["blocks_per_s"] > 0 and w["errors"] == {}
        assert w["latency"]["p50_ms"] <= w["latency"]["p99_ms"]
        assert w["disjoint_check"]["disjoint"] is True
        assert w["cas_retries_per_block"] == 0  # one serialized controller: no compare-and-set
        assert w["node_cpu_s"] > 0 and w["node_cpu_ms_per_block"] == pytest.approx(
            w["node_cpu_s"] * 1000 / w["blocks"])
        assert isinstance(w["terms_started"], int) and w["terms_started"] >= 0
        assert isinstance(w["leader_changes"], int) and w["leader_changes"] >= 0
    assert pq["settings"]["differing_from_defaults"] == {"allocate_rate_per_broker": 0}
    assert "options that differ from a node's defaults: allocate_rate_per_broker = 0" in result.output
    assert pq["w1"]["brokers"] == 1 and pq["w2"]["brokers"] == 3
    w3 = pq["w3"]
    assert w3["kills"] == 1 and len(w3["rounds"]) == 1 and w3["disjoint_check"]["disjoint"] is True
    assert w3["outage_median_ms"] is not None and w3["outage_median_ms"] > 0
    assert w3["manager"]["ids_increasing"] is True and w3["manager"]["ids"] > 0
    w4 = pq["w4"]
    assert w4["calls"] > 0 and 0 < w4["p50_us"] <= w4["p99_us"] and w4["ids_increasing"] is True
    rows = pq["w5"]["rows"]
    assert [r["history_target"] for r in rows] == [10, 300]
    assert all(r["after_restart_above_every_earlier_block"] and r["failures"] == [] for r in rows)
    assert {t["target"].split(":")[0] for t in res["targets"]} >= {"w4", "w5"}
    assert [x["scenario"] for x in res["load"]][:2] == ["w1 pidquorum", "w2 pidquorum"]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "one broker, sequential" in result.output and "Targets:" in result.output
    fl = res["floor"]  # measured beside workload 1
    assert fl["commits"] > 0 and fl["p50_ms"] <= fl["p99_ms"]
    assert "floor of a replicated fsync'd commit" in result.output


@pytest.mark.parametrize("peer", ["zookeeper", "etcd"])
def test_bench_peer_sequential_and_concurrent(tmp_path, peer):
    reason = missing_reason(peer)
    if reason:
        pytest.skip(reason)
    out = tmp_path / "out"
    invoke("--systems", f"pidquorum,{peer}", "--duration", "1", "--workloads", "1,2", "--out", str(out))
    res = json.loads((out / "bench.json").read_text())
    assert res["errors"] == [], res["errors"]
    w2 = res["systems"][peer]["w2"]
    assert res["systems"][peer]["w1"]["blocks"] > 0 and w2["blocks"] > 0
    assert w2["disjoint_check"]["disjoint"] is True and w2["cas_retries_per_block"] >= 0
    assert w2["node_cpu_ms_per_block"] > 0 and "terms_started" not in w2  # the peer's CPU too; no Raft counts
    # the targets relative to ZooKeeper are checked only when it ran; pidquorum's own (CPU, elections) always
    assert any(t["target"].startswith(("w1:", "w2:")) for t in res["targets"]) == (peer == "zookeeper")
    assert any(t["target"].startswith("w1, w2: no election") for t in res["targets"])


def test_bench_bad_options_are_usage_errors(tmp_path):
    assert "unknown" in invoke("--systems", "pidquorum,redis", "--out", str(tmp_path), expect=EXIT_USAGE).output
    assert "1-5" in invoke("--workloads", "1,9", "--out", str(tmp_path), expect=EXIT_USAGE).output
    assert not os.path.exists(tmp_path / "bench.json")


def test_outage_is_the_longest_wait_after_the_kill_for_the_worst_broker():
    recs = [{"t1": [1.0, 2.0, 5.0, 6.0]}, {"t1": [1.5, 2.5, 3.0]}]
    assert outage_of(recs, 2.2) == pytest.approx(3.0)   # broker 1: 2.0 -> 5.0
    assert outage_of(recs, 3.5) == math.inf              # broker 2 never got another block
    # An answer that was on its way when the leader died lands just after the kill: the wait after it counts.
    recs = [{"t1": [0.9, 1.0, 1.002, 1.9, 1.91, 1.92]}]
    assert outage_of(recs, 1.001, window=4.0) == pytest.approx(0.898)
    # Nothing within the window: the gap runs to the first block after it.
    assert outage_of([{"t1": [1.0, 9.0]}], 1.5, window=4.0) == pytest.approx(8.0)


def test_throughput_counts_every_call_and_checks_overlaps():
    rec = {"t0": [0.0, 1.0], "t1": [0.5, 2.5], "start": [0, 500], "length": [1000, 1000], "retries": [0, 2],
           "errors": {"X": 1}}
    t = throughput([rec], (0.0, 2.0))
    assert t["blocks"] == 2 and t["seconds"] == 2.5 and t["cas_retries_per_block"] == 1.0
    assert t["disjoint_check"] == {"blocks": 2, "disjoint": False, "overlaps": 1}
    assert t["errors"] == {"X": 1}


def test_targets_compare_with_zookeeper_of_the_same_run():
    def w(bps, p50, p99, cpu=0.5, terms=0):
        return {"blocks_per_s": bps, "latency": {"p50_ms": p50, "p99_ms": p99}, "node_cpu_ms_per_block": cpu,
                "terms_started": terms}
    zk = {"w1": w(120, 2, 5), "w2": w(150, 3, 20), "w3": {"outage_median_ms": 400}}

    def holds(pq):  # "w1", "w2", "w3", "cpu", "elections" -> whether it holds
        short = {"node CPU": "cpu", "no election": "elections"}
        out = {}
        for t in evaluate_targets({"systems": {"pidquorum": pq, "zookeeper": zk}}):
            key = t["target"].split(":")[0]
            out[next((v for k, v in short.items() if k in t["target"]), key)] = t["holds"]
        return out

    good = {"w1": w(360, 1.0, 2), "w2": w(750, 1.5, 20), "w3": {"outage_median_ms": 300}}
    assert holds(good) == {"w1": True, "w2": True, "w3": True, "cpu": True, "elections": True}
    assert holds({**good, "w1": w(359, 1.0, 2)})["w1"] is False  # under 3x ZooKeeper
    assert holds({**good, "w1": w(400, 1.01, 2)})["w1"] is False  # p50 over 1 ms
    assert holds({**good, "w2": w(749, 1.5, 20)})["w2"] is False  # under 5x
    assert holds({**good, "w2": w(900, 1.5, 21)})["w2"] is False  # p99 above ZooKeeper's
    assert holds({**good, "w3": {"outage_median_ms": 301}})["w3"] is False  # over 300 ms
    assert holds({**good, "w1": w(360, 1.0, 2, cpu=1.2)})["cpu"] is False  # CPU per block
    assert holds({**good, "w2": w(750, 1.5, 20, terms=1)}) == {"w1": True, "w2": True, "w3": True, "cpu": True,
                                                               "elections": False}


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_bench_name_takes_its_own_options(name):
    result = invoke(name, "--help")
    assert result.output.startswith(f"usage: cli bench {name} ") and "--json" in result.output


def test_bench_name_runs_that_benchmark(tmp_path):
    out = tmp_path / "quota.json"
    result = invoke("quota", "--quick", "--phases", "sizing,check_cost", "--calls", "1000", "--json", str(out))
    res = json.loads(out.read_text())
    assert list(res["phases"]) == ["sizing", "check_cost"] and res["errors"] == [] and res["failed_checks"] == []
    assert "memory per principal by rate" in result.output and "all checks passed" in result.output


def test_bench_name_and_comparison_options_do_not_mix():
    assert "options of the comparison" in invoke("--duration", "2", "quota", expect=EXIT_USAGE).output
    assert "No such command" in invoke("nosuch", expect=EXIT_USAGE).output
