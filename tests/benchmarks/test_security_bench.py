"""``pidctl bench security --phases raft-attack``: runs, and reports what the issue asks to compare."""
import json
import os
import subprocess
import sys

import benchmarks


def test_the_raft_attack_phase_reports_elections_latency_and_memory_with_and_without_the_attack(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.security", "--phases", "raft-attack", "--attack-seconds",
                          "1.5", "--streamers", "1", "--json", str(tmp_path / "s.json")], capture_output=True,
                         text=True, timeout=240, cwd=os.path.dirname(os.path.dirname(benchmarks.__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "s.json").read_text())["phases"]["raft-attack"]
    for run in ("none", "attack"):
        assert res[run]["allocations"] > 0 and res[run]["p99_ms"] > 0
        assert {"terms_passed", "leader_changed", "leader_rss_mb_max"} <= set(res[run])
    kinds = sorted(a["kind"] for a in res["attackers"])
    assert kinds == ["flood", "slowloris", "stream"]
    # The port took attackers' connections (at its accept_rate: some attackers may wait in its queue throughout).
    assert sum(a["connects"] for a in res["attackers"]) > 0
