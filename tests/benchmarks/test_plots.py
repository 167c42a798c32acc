"""The two charts: bench.png (benchmarks.run) has no empty panel, broker_rates.png (chaos.audit.report) has a
time axis in the unit its span needs.  Checked on the matplotlib objects, not on pixels."""
from __future__ import annotations

import os

from chaos.audit.report import rates_figure, rates_png, time_unit
from benchmarks.run_report import chart_figure, draw_chart

RES = {"started_at": "2026-01-01T00:00:00+00:00", "environment": {"loadavg_start": [0.5, 0.5, 0.5]}}


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_bench_chart_draws_only_the_panels_that_have_figures(tmp_path):
    res = dict(RES, systems={"zookeeper": {"w1": {"blocks_per_s": 334.0, "latency": {"p99_ms": 12.75}}},
                             "pidquorum": {"w1": {"blocks_per_s": 900.0, "latency": {"p99_ms": 3.5}}}})
    fig = chart_figure(res)
    assert [ax.get_title() for ax in fig.axes] == ["1 broker: blocks/s", "p99 latency ms (1 broker)"]
    for ax in fig.axes:
        heights = sorted(p.get_height() for p in ax.patches)
        assert len(heights) == 2 and heights[0] > 0
    assert "334" in _texts(fig.axes[0]) and "12.8" in _texts(fig.axes[1])
    # w3 ran for one system only: its panel is drawn, and says "not run" for the other.
    res["systems"]["pidquorum"]["w3"] = {"outage_median_ms": 250.0}
    titles = [ax.get_title() for ax in chart_figure(res).axes]
    assert titles[-1] == "leader kill: outage ms (median)" and "3 brokers: blocks/s" not in titles
    assert "not run" in _texts(chart_figure(res).axes[-1])
    path = draw_chart(res, str(tmp_path / "bench.png"))
    assert os.path.getsize(path) > 0


def test_bench_chart_without_any_figure_says_no_data():
    fig = chart_figure(dict(RES, systems={}))
    assert len(fig.axes) == 1 and not fig.axes[0].axison
    assert any("no data" in t for t in _texts(fig.axes[0]))
    fig = chart_figure(dict(RES, systems={"etcd": {}}))  # started, every workload failed
    assert len(fig.axes) == 1 and any("no data" in t for t in _texts(fig.axes[0]))


def _series(windows: int, window_ms: int) -> dict:
    w0 = 1_767_225_600_000 // window_ms  # 2026-01-01 00:00 UTC
    return {"cluster": {"brokers": {"1": [(w0 + i, 5) for i in range(windows)],
                                    "2": [(w0 + i, 1) for i in range(0, windows, 2)]}, "flagged": [2]}}


def test_rates_chart_of_a_five_minute_run_has_a_seconds_axis(tmp_path):
    fig = rates_figure(_series(30, 10_000), 10_000)  # 30 windows of 10 s
    (ax,) = fig.axes
    assert ax.get_xlabel() == "seconds since 2026-01-01 00:00:00 UTC"
    assert ax.get_xlim() == (0.0, 300.0)
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == ["broker 1", "broker 2 (restart loop?)"]
    assert os.path.getsize(rates_png(_series(30, 10_000), 10_000, tmp_path / "broker_rates.png")) > 0


def test_rates_chart_picks_minutes_hours_days_by_span():
    (ax,) = rates_figure(_series(180, 60_000), 60_000).axes  # 3 hours of 1-minute windows
    assert ax.get_xlabel().startswith("minutes since") and ax.get_xlim() == (0.0, 180.0)
    (ax,) = rates_figure(_series(24, 3_600_000), 3_600_000).axes  # a day
    assert ax.get_xlabel().startswith("hours since") and ax.get_xlim() == (0.0, 24.0)
    assert time_unit(7 * 86400) == ("days", 86400.0)


def test_rates_chart_says_no_data_in_a_panel_without_blocks():
    series = dict(_series(30, 10_000), empty={"brokers": {}, "flagged": []})
    full, empty = rates_figure(series, 10_000).axes
    assert full.axison and not empty.axison and any("no data" in t for t in _texts(empty))
