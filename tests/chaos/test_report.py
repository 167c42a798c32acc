"""chaos.report: the rich summary and the PNG timeline."""
from __future__ import annotations

import io
import struct

from rich.console import Console

from chaos.checker import check
from chaos.report import render_summary, timeline_png
from tests.chaos import Hist, audit_block, clean_run, final_state
from tests.chaos.test_checker import availability_history

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def recording_console() -> Console:
    return Console(record=True, width=200, color_system=None, file=io.StringIO())


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_valid_summary_says_valid_and_shows_availability():
    h, final = clean_run()
    con = recording_console()
    render_summary(check(h.ops, final), con)
    text = con.export_text()
    assert text.startswith("VALID: 26 ops, 3 acknowledged blocks, 9 producer IDs")
    assert "INVALID" not in text
    assert "availability" in text and "generate" in text and "allocate" in text
    assert "kill-leader" in text  # faults table


def test_invalid_summary_lists_each_anomaly_kind_with_its_first_examples():
    h, final = clean_run()
    for _ in range(25):
        h.generate("pidmgr-1", 0)
    h.generate("pidmgr-2", 7)
    con = recording_console()
    render_summary(check(h.ops, final), con, limit=3)
    text = con.export_text()
    assert text.startswith("INVALID: 26 anomalies")
    assert "duplicate-pid: first 3 of 25" in text
    assert "A producer ID returned by two successful generate ops." in text
    assert text.count("PID 0 issued twice") == 3
    assert "pid-outside-own-blocks: first 1 of 1" in text
    assert "pidmgr-2 issued PID 7, which lies in [0, 10) acknowledged to pidmgr-1" in text


def test_summary_shows_warnings_and_availability_figures():
    h = availability_history()
    v = check(h.ops, final_state(20, [audit_block(1, 1, 0, 10), audit_block(2, 2, 10, 10)]))
    v.warnings.append("dropped a torn last line")
    con = recording_console()
    render_summary(v, con)
    text = con.export_text()
    assert "warning: dropped a torn last line" in text
    rows = {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│"))}
    # (allocate, generate) columns, as worked out by hand in test_checker
    assert rows["invoked"] == ["3", "6"]
    assert rows["info (unknown)"] == ["0", "1"] and rows["unfinished"] == ["0", "1"]
    assert rows["latency p50 ms (ok)"] == ["1.00", "2.00"] and rows["latency p99 ms (ok)"] == ["1.00", "4.00"]
    assert rows["longest outage ms"] == ["1.6", "10.0"]
    assert rows["load in progress"] == ["0 (0.00%)", "2 (33.33%)"]
    assert rows["client-visible waits"] == ["1", "3"]
    assert rows["pause-leader"] == ["1", "0", "3.0"]


def test_timeline_png_is_written(tmp_path):
    h = availability_history()
    # a few seconds more of steady generates, so there are several buckets
    h.allocate("broker-3", 3, 100, 1000)
    for i in range(300):
        h.generate("broker-3", 100 + i)
    path = tmp_path / "timeline.png"
    out = timeline_png(h.ops, path, bucket_s=0.05)
    assert out == str(path)
    data = path.read_bytes()
    assert png_size(data) == (1200, 700)
    assert len(data) > 20_000  # axes, lines, legend, shading: not an empty canvas


def test_timeline_png_without_faults_or_successes(tmp_path):
    h = Hist()
    h.invoke("broker-1", "generate")
    h.op("broker-1", "fail", "generate", error="COORDINATOR_LOAD_IN_PROGRESS", t_ms=3 * 1000)
    path = timeline_png(h.ops, tmp_path / "t.png")
    assert png_size(open(path, "rb").read()) == (1200, 700)


def _pixels_near(png_path, rgb, tol=4) -> int:
    from matplotlib.image import imread
    import numpy as np
    img = (imread(png_path)[..., :3] * 255).round()
    return int((np.abs(img - np.array(rgb)).max(axis=-1) <= tol).sum())


def test_timeline_shades_applied_faults_only(tmp_path):
    """Identical runs but for the fault's outcome: an applied fault is shaded, a failed one is not."""
    def run(outcome: str):
        h = Hist()
        h.allocate("broker-1", 1, 0, 1000)
        h.invoke("nemesis", "partition-leader", {"node": 1})
        for i in range(50):
            h.generate("broker-1", i)
        h.op("nemesis", outcome, "partition-leader", {"node": 1}, error=None if outcome == "ok" else "NO_LEADER")
        for i in range(50, 100):
            h.generate("broker-1", i)
        return h.ops

    shade = (247, 212, 212)  # tab:red (214, 39, 40) at alpha 0.2 over white
    applied = timeline_png(run("ok"), tmp_path / "applied.png", bucket_s=0.01)
    failed = timeline_png(run("fail"), tmp_path / "failed.png", bucket_s=0.01)
    assert _pixels_near(applied, shade) > 20_000  # a band across both plots
    assert _pixels_near(failed, shade) < 100


def test_timeline_of_a_long_run_with_a_tiny_bucket_widens_the_buckets(tmp_path):
    h = Hist()
    h.allocate("broker-1", 1, 0, 1000)
    h.generate("broker-1", 0)
    h.t = 10 * 3600 * 10 ** 9  # ten hours later: 3.6e7 buckets of 1 ms would be asked for
    h.generate("broker-1", 1)
    path = timeline_png(h.ops, tmp_path / "long.png", bucket_s=0.001)
    assert png_size(open(path, "rb").read()) == (1200, 700)
