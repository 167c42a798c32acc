"""``pidctl bench producers``: a small run end to end (in process and over the wire, a real quorum and
broker), every figure present, finite and positive; the sanity checks catch a run that went wrong.

Figures are not compared with targets here (a benchmark is not a timed test); that they exist and are
plausible is what is asserted.
"""
from __future__ import annotations

import copy
import json
import math

import pytest
from click.testing import CliRunner

from benchmarks import producers
from cli.main import cli

N = 5000  # large enough that the broker's RSS grows measurably, small enough to take seconds

IN_PROCESS_FIGURES = [
    ("rss", "rss_bytes_per_producer"), ("tracemalloc", "traced_bytes_per_producer"),
    ("five_batches", "rss_bytes_per_producer"),
    ("rss", "expire_all_ms"), ("rss", "expire_none_ms"), ("rss", "snapshot_write_ms"), ("rss", "snapshot_load_ms"),
    ("rss", "snapshot_bytes"), ("rss", "snapshot_bytes_per_producer"), ("rss", "partition_close_ms"),
    ("rss", "partition_reopen_ms"),
]
WIRE_FIGURES = [
    ("rss_bytes_per_producer",), ("fill", "producers_per_s"),
    ("baseline", "p50_ms"), ("baseline", "p99_ms"), ("baseline", "longest_stall_ms"),
    ("loaded", "p50_ms"), ("loaded", "p99_ms"), ("loaded", "longest_stall_ms"), ("p99_over_baseline",),
    ("restart", "stop_s"), ("restart", "ready_file_s"), ("restart", "first_produce_answered_s"),
]


def figure(d: dict, path: tuple) -> float:
    for key in path:
        assert isinstance(d, dict) and key in d, f"missing {'/'.join(path)}"
        d = d[key]
    return d


def assert_sane(v, what: str) -> None:
    assert isinstance(v, (int, float)) and not isinstance(v, bool), f"{what}: {v!r} is not a number"
    assert math.isfinite(v) and v > 0, f"{what}: {v!r}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("producers") / "producers.json"
    result = CliRunner().invoke(cli, ["bench", "producers", "--sizes", str(N), "--active-seconds", "1",
                                      "--active-producers", "4", "--json", str(out), "-o", "json"])
    return result, out


def test_every_figure_is_there_finite_and_positive(run):
    result, out = run
    res = json.loads(out.read_text())
    assert result.exit_code == 0, (result.exit_code, res["errors"], res["failed_checks"], result.output[-3000:])
    assert json.loads(result.stdout) == res  # -o json prints what --json wrote
    assert res["errors"] == [] and res["failed_checks"] == []
    ip, wire = res["phases"]["in_process"][str(N)], res["phases"]["wire"][str(N)]
    for path in IN_PROCESS_FIGURES:
        assert_sane(figure(ip, path), f"in_process/{'/'.join(path)}")
    for path in WIRE_FIGURES:
        assert_sane(figure(wire, path), f"wire/{'/'.join(path)}")
    # Plausible, not just positive: a producer's state is tens to hundreds of bytes, not kilobytes per batch.
    for path in (("rss", "rss_bytes_per_producer"), ("tracemalloc", "traced_bytes_per_producer")):
        assert 50 < figure(ip, path) < 10_000, path
    five, one = figure(ip, ("five_batches", "rss_bytes_per_producer")), figure(ip, ("rss", "rss_bytes_per_producer"))
    assert five > one, (five, one)
    assert 10 < ip["rss"]["snapshot_bytes_per_producer"] < 1_000
    assert 0 < wire["rss_bytes_per_producer"] < 100_000
    assert ip["rss"]["producers_after_reopen"] == N
    for run_ in ("baseline", "loaded"):
        r = wire[run_]
        assert r["n"] > r["producers"] and r["errors"] == {} and r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert len(r["stall_episodes"]) == min(50, r["stall_episodes_over_target"])
    assert wire["duplicate_after_restart"]["state_survived"] is True
    assert {t["target"].split(" ")[0] for t in res["targets"]} == {"p99", "no", "restart", "bytes", "expiry"}
    assert res["references"]["expire_all_ms"]["by_size"]["1000000"] == 5.731


def test_the_table_has_every_row(run, capsys):
    res = json.loads(run[1].read_text())
    producers.print_results(res)
    text = capsys.readouterr().out
    for label in ("B/idle producer, in process (RSS)", "tracemalloc", "5 batches kept", "expire(), all expire",
                  "write_snapshot", "load_snapshot", "broker process (RSS, wire)", "active p99 / baseline p99",
                  "longest stall", "stalls over 50 ms", "restart -> Produce answered", "~255 B", "~415 B",
                  "PR #16075", "Partition(dir) reopen", "broker RSS", "all checks passed"):
        assert label in text, label


def test_checks_catch_a_run_that_went_wrong(run):
    res = json.loads(run[1].read_text())
    assert producers.checks(res) == []
    bad = copy.deepcopy(res)
    bad["phases"]["in_process"][str(N)]["rss"]["snapshot_loaded_producers"] = 0
    bad["phases"]["wire"][str(N)]["duplicate_after_restart"]["state_survived"] = False
    bad["phases"]["wire"][str(N)]["loaded"]["errors"] = {"OUT_OF_ORDER_SEQUENCE_NUMBER": 1}
    found = producers.checks(bad)
    assert len(found) == 3 and any("snapshot loaded 0" in c for c in found), found


def test_longest_gap_stall_episodes_and_sizes():
    assert producers.longest_gap([1.0, 1.5, 3.0, 3.1]) == pytest.approx(1.5)
    assert producers.longest_gap([1.0]) is None
    # Two producers held by one broker stall are one episode; a short gap is none.
    gaps = [(1.0, 1.6), (1.1, 1.7), (2.0, 2.01), (5.0, 5.2)]
    assert producers.stall_episodes(gaps, 0.05) == [(1.0, 1.7), (5.0, 5.2)]
    assert producers.sizes_arg("10_000, 2000") == [10_000, 2000]
    with pytest.raises(Exception):
        producers.sizes_arg("0")
