"""``benchmarks.ab``: two source trees of the node side by side, in pairs of fresh clusters."""
from __future__ import annotations

import json
import os

import pytest

from benchmarks import ab

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(rate, p50, cpu):
    return {"rate": rate, "p50_ms": p50, "p99_ms": 2 * p50, "cpu_ms": cpu}


def test_the_verdict_is_the_median_of_the_pairs_ratios_and_how_many_pairs_went_each_way():
    runs = {"base": [_run(100, 1.0, 1.0), _run(200, 2.0, 1.0), _run(100, 1.0, 1.0)],
            "change": [_run(110, 0.9, 1.1), _run(180, 1.8, 0.9), _run(130, 1.2, 1.0)]}
    s = ab.summarize(runs)
    assert s["rate"]["paired_ratio"] == pytest.approx(1.1) and s["rate"]["change_better"] == 2  # higher is better
    assert s["p50_ms"]["paired_ratio"] == pytest.approx(0.9) and s["p50_ms"]["change_better"] == 2  # lower is
    assert s["cpu_ms"]["change_better"] == 1 and s["cpu_ms"]["pairs"] == 3  # an equal pair counts for neither
    assert s["rate"]["base"] == 100 and s["rate"]["change"] == 130  # each side's own median


def test_a_directory_that_is_no_source_tree_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ab.main([str(tmp_path), REPO])
    assert e.value.code == 2 and "not a pidquorum source tree" in capsys.readouterr().err


def test_one_pair_runs_both_trees_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "ab.json"
    assert ab.main([REPO, REPO, "--pairs", "1", "--seconds", "0.3", "--warmup", "5", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for side in ("base", "change"):
        (run,) = res["runs"][side]
        assert run["allocations"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"] and run["cpu_ms"] > 0
    assert res["summary"]["rate"]["pairs"] == 1
    assert "paired change/base" in capsys.readouterr().out
