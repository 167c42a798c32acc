"""pidctl's output: tables that fit 80 columns with no value cut, and -o json on the commands that
print results (snapshot take, demo, user add, bench)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from rich.console import Console

from cli import render
from cli.common import EXIT_USAGE

PIDCTL = os.path.join(os.path.dirname(sys.executable), "pidctl")


def _fits_80(text: str) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text


def test_demo_json_snapshot_json_and_quorum_status_at_80_columns(pidctl):
    demo = json.loads(pidctl("demo", "-o", "json").stdout)
    assert set(demo) == {"cluster", "brokers", "blocks", "status", "health", "stop"}
    assert [b["broker_id"] for b in demo["brokers"]] == [1, 2] and len(demo["blocks"]) == 6
    assert demo["health"]["exit_code"] == 0 and len(demo["status"]) == 3

    # As a user at an 80-column terminal (not a tty here: COLUMNS sets the width).
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([PIDCTL, "--data-dir", pidctl.data_dir, "quorum", "status"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    _fits_80(out.stdout)
    header = next(line for line in out.stdout.splitlines() if line.lstrip().startswith("node "))
    assert header.split() == ["node", "client", "role", "term", "applied", "lag", "next", "PID"]
    for n in demo["status"]:
        assert n["client_address"] in out.stdout  # whole, on one line
    addresses = {str(n["node_id"]): n["client_address"] for n in demo["status"]}
    leader_row = next(line.split() for line in out.stdout.splitlines() if " leader " in line)
    assert leader_row[1] == addresses[leader_row[0]] and leader_row[2] == "leader"
    assert leader_row[-1] == str(demo["blocks"][-1]["next_producer_id"])  # the leader applied every block
    assert "figure" in out.stdout and "blocks per broker" in out.stdout

    taken = json.loads(pidctl("snapshot", "take", "-o", "json").stdout)
    assert [t["client_address"] for t in taken] == demo["cluster"]["client_addresses"]
    assert all(os.path.exists(t["path"]) and t["bytes"] > 0 for t in taken)


def _node(i: int, role: str = "follower", **extra) -> dict:
    raft = {"self": f"10.10.10.10{i}:49152", "state": role, "leader": "10.10.10.101:49152", "term": 12345,
            "commit_index": 123456789, "last_applied": 123456789, "recovering": extra.get("recovering"),
            "leader_changes": 7, "journal_sync_latency": {"count": 123456, "p50_s": 0.00025, "p99_s": 0.0123},
            "peers": {f"10.10.10.10{j}:49152": {"lag_entries": 12345 if role == "leader" else None,
                                                 "link": {"out": "aes256gcm-1", "in": "fernet"}}
                      for j in (1, 2, 3) if j != i}}
    return {"node_id": i, "client_address": f"10.10.10.10{i}:65535", "raft": raft, "lag": 0,
            "state": {"next_producer_id": 123456789000}, "snapshot": {"bytes": 123456789, "age_s": 3600.0},
            "allocations": {"1": {"blocks": 123456}, "2": {"blocks": 7}},
            "allocate_latency": {"count": 1234567, "p99_s": 0.0025}, "server": {"throttled": 12}}


def test_quorum_status_with_large_values_fits_80_columns_nothing_cut(monkeypatch, capsys):
    buf = io.StringIO()
    monkeypatch.setattr(render, "_out", Console(file=buf, width=80, highlight=False, soft_wrap=True))
    nodes = [_node(1, "leader"), _node(2, recovering={"reason": "disk"}),
             {"node_id": 3, "client_address": "10.10.10.103:65535", "error": "connection refused"}]
    render.quorum_status("table", nodes)
    text = buf.getvalue()
    _fits_80(text)
    for value in ("10.10.10.101:65535", "10.10.10.102:65535", "10.10.10.103:65535", "recovering", "12345",
                  "123456789", "123456789000", "node 3 is down: connection refused", "AES-GCM", "Fernet"):
        assert value in text, value
    capsys.readouterr()
    render.quorum_status("json", nodes)  # -o json: everything, as answered
    assert json.loads(capsys.readouterr().out) == nodes


def test_user_add_json(pidctl, tmp_path):
    path = str(tmp_path / "users")
    r = pidctl("user", "add", "alice", "--file", path, "--password-stdin", "-o", "json", input="s3cret\n")
    added = json.loads(r.stdout)
    assert added["user"] == "alice" and added["file"] == path and added["added"] is True
    assert added["mechanism"] == "SCRAM-SHA-256" and added["iterations"] > 0
    again = json.loads(pidctl("user", "add", "alice", "--file", path, "--password-stdin", "-o", "json",
                              input="other\n").stdout)
    assert again["added"] is False


def test_bench_json_named_and_comparison(pidctl, tmp_path):
    r = pidctl("bench", "quota", "--quick", "--phases", "sizing", "-o", "json")
    res = json.loads(r.stdout)  # stdout is the JSON alone; the benchmark's printout went to stderr
    assert "sizing" in res["phases"] and res["params"]["quick"] is True
    assert "all checks passed" in r.stderr
    kept = tmp_path / "quota.json"
    r = pidctl("bench", "quota", "--quick", "--phases", "sizing", "--json", str(kept), "--output=json")
    assert json.loads(r.stdout) == json.loads(kept.read_text())
    assert "expected table or json" in pidctl("bench", "quota", "-o", "xml", expect=EXIT_USAGE).output

    # The comparison: etcd alone, workload 5 (pidquorum only): nothing runs, still a whole result.
    r = pidctl("bench", "--systems", "etcd", "--workloads", "5", "--out", str(tmp_path / "out"), "-o", "json")
    res = json.loads(r.stdout)
    assert res["json_path"] == str(tmp_path / "out" / "bench.json") and "pidquorum" not in res["systems"]
