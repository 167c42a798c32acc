"""``benchmarks.stages``: workload 1's stages, timed by probes in the nodes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks import stages


def test_segments_take_each_stage_once_in_order_and_skip_incomplete_ones():
    events = [("parsed", 0), ("batch", 5_000), ("acked", 6_000), ("proposed", 9_000), ("batch", 9_500),
              ("proposed", 10_000),
              ("parsed", 20_000), ("batch", 21_000),  # never proposed: left out
              ("parsed", 30_000), ("proposed", 31_000), ("batch", 33_000), ("proposed", 40_000)]
    out = stages._segments(events, "parsed", ("parsed", "batch", "proposed"))
    assert out == {"batch": [5.0, 3.0], "proposed": [4.0, 7.0]}


def test_the_run_times_every_stage_of_the_leader_and_both_followers(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.stages", "--seconds", "1", "--warmup", "20",
                          "--json", str(tmp_path / "s.json")], capture_output=True, text=True, timeout=180,
                         cwd=os.path.dirname(os.path.dirname(stages.__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "s.json").read_text())
    measured = res["client"]["allocations"]
    assert measured > 0
    leader = {r["stage"]: r for r in res["leader"]}
    assert list(leader) == list(stages.LEADER_STAGES[1:])
    for r in leader.values():  # every measured request went through every stage (the warm-up's too)
        assert r["count"] >= measured and r["p50_us"] > 0
    assert len(res["followers"]) == 2
    for rows in res["followers"]:
        assert [r["stage"] for r in rows] == list(stages.FOLLOWER_STAGES[1:])
        assert all(r["count"] >= measured for r in rows)
        synced = next(r for r in rows if r["stage"] == "synced")
        assert synced["p50_us"] > 0  # the fdatasync itself
    assert "leader: microseconds since the stage before" in out.stdout
