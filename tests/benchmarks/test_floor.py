"""``benchmarks.floor``: the bare replicated, fsync'd commit that workload 1 is compared with."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks import floor


def test_every_commit_is_written_by_both_followers(tmp_path):
    res = floor.measure(str(tmp_path / "floor"), duration=0.5, warmup=0.1)
    assert res["commits"] > 0 and res["commits_per_s"] == res["commits"] / 0.5
    assert 0 < res["p50_ms"] <= res["p99_ms"]
    # Each request reached both followers whole (the leader waits for both before the next one; the warm-up's
    # requests are written too, so even a follower stopped before its last copy holds every measured one).
    for i, size in enumerate(res["follower_bytes"]):
        assert size % floor.MESSAGE == 0 and size // floor.MESSAGE >= res["commits"]
        # written as the journal is: into zeros preallocated ahead (its syncs change no file size)
        assert os.path.getsize(tmp_path / "floor" / f"follower-{i}.log") >= size + (1 << 20)


def test_the_sync_figures_compare_growing_and_preallocated_files_and_leave_no_file(tmp_path):
    res = floor.measure_syncs(str(tmp_path / "s"), count=20, writers=2)
    for mode in ("growing", "preallocated"):
        assert 0 < res[mode]["p50_ms"] <= res[mode]["p99_ms"]
    assert os.listdir(tmp_path / "s") == []
    info = floor.sync_writer(str(tmp_path / "one.log"), 4096, 30)  # the writer alone: its file is preallocated
    assert info["p50_ms"] > 0 and os.path.getsize(tmp_path / "one.log") == 2 * 4096  # 30 x 256 B fit in the first step


def test_the_command_prints_json_and_leaves_no_process(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.floor", "run", str(tmp_path / "f"), "--duration", "0.3"],
                         capture_output=True, text=True, timeout=120, check=True,
                         cwd=os.path.dirname(os.path.dirname(floor.__file__)))
    res = json.loads(out.stdout)
    assert res["commits"] > 0
    assert len([n for n in os.listdir(tmp_path / "f") if n.endswith(".port")]) == 3  # three servers ran
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _mentions(pid, str(tmp_path / "f"))]


def _mentions(pid: str, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False
