"""The audit job on Spark: was any producer ID issued twice, over the whole exported history?

``run_audit`` validates an export of ``pidctl audit export`` (``chaos.audit.inputs``), starts or reuses
Spark, runs the checks (``chaos.audit.checks``) per ID space, and writes ``audit.json`` and the charts
of ``chaos.audit.report``.  Its command lines are in ``cli.audit``.  How to run it, what an ID space is
and what a run costs: docs/simulation.md, section 13, "The job", "ID spaces" and "Cost and scale-out".
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable

from chaos.audit.inputs import TABLES, AuditInputError, load_manifest, scan_table
from chaos.audit.options import EXAMPLES, PHASES, WINDOW_MS, Options, Timer  # noqa: F401 (the job's names)
from chaos.audit.report import rates_png
from chaos.audit.spark import spark_session, tune_for_rows

CLUSTER_SPACE = "cluster"


def id_spaces(manifest: dict, mode: str = "cluster") -> dict[str, str]:
    """Source name -> the name of its ID space (see the module doc).  With several cluster or node
    sources in "cluster" mode they share the space ``CLUSTER_SPACE``; a single one keeps its own name."""
    if mode not in ("cluster", "source"):
        raise ValueError(f"id_spaces must be 'cluster' or 'source', not {mode!r}")
    sources = [s for s in manifest.get("sources", []) if isinstance(s, dict) and isinstance(s.get("name"), str)]
    shared = [s["name"] for s in sources if s.get("kind") in ("cluster", "node")] if mode == "cluster" else []
    out = {s["name"]: s["name"] for s in sources}
    if len(shared) > 1:
        out.update({name: CLUSTER_SPACE for name in shared})
    return out


def run_audit(input_dir: str, master: str | None = "local[*]", out_dir: str | None = None, *, spark=None,
              options: Options | None = None, progress: Callable[[int, str], None] | None = None, **kw) -> dict:
    """Audit an export directory; returns the report (also ``out_dir/audit.json`` and PNG charts if
    ``out_dir``).  ``spark``: an existing SparkSession (else the active one, else one is started for
    ``master``, ``None`` for spark-submit's, and stopped afterwards).  Keyword arguments override
    ``Options`` fields.  ``progress(index, description)`` is told as each of ``PHASES`` starts (nothing
    else).  Raises ``AuditInputError`` on bad input, before anything is written or Spark
    starts; a stale ``audit.json`` in ``out_dir`` is removed first, so a failed run never leaves a
    report that looks complete."""
    opts = options or Options()
    for k, v in kw.items():
        if not hasattr(opts, k):
            raise TypeError(f"unknown option {k!r}")
        setattr(opts, k, v)
    timer = Timer(progress)
    input_dir = os.fspath(input_dir)
    if out_dir is not None:
        out_dir = os.fspath(out_dir)
        stale = os.path.join(out_dir, "audit.json")
        if os.path.exists(stale):
            os.remove(stale)
    manifest = load_manifest(input_dir)
    tables = {name: scan_table(input_dir, manifest, name) for name in TABLES}
    block_rows = sum(tables[n].rows for n in ("alloc", "seed", "chaos_allocate"))
    if block_rows + tables["chaos_generate"].rows == 0:
        raise AuditInputError("no producer-ID blocks, seeds or chaos PIDs in the export: nothing to audit", input_dir)
    timer.lap("validate")

    from pyspark.sql import SparkSession  # heavy (pyspark): imported when used

    from chaos.audit.brokers import finish_projection  # heavy (pyspark): imported when used
    from chaos.audit.checks import run_checks  # heavy (pyspark): imported when used

    own = False
    if spark is None:
        spark = SparkSession.getActiveSession()
        if spark is None:  # start one for this run, and stop it afterwards
            spark = spark_session(master)
            own = True
    timer.lap("spark_start")
    try:
        partitions = tune_for_rows(spark, block_rows + tables["chaos_generate"].rows)
        spaces = id_spaces(manifest, opts.id_spaces)
        report = run_checks(spark, tables, opts, timer, spaces)
    finally:
        if own:
            spark.stop()
    report["spark"] = {"master": master if own and master is not None else spark.sparkContext.master,
                       "version": spark.version, "shuffle_partitions": partitions, "buckets": report.pop("_buckets")}
    grouped: dict[str, list[str]] = {}
    for name, space in spaces.items():
        grouped.setdefault(space, []).append(name)
    report["id_spaces"] = {"mode": opts.id_spaces, "spaces": {k: sorted(v) for k, v in sorted(grouped.items())}}
    report["input"] = {"dir": os.path.abspath(input_dir), "sources": manifest.get("sources", []),
                       "tables": {t.spec.relpath: {"files": len(t.files), "rows": t.rows} for t in tables.values()}}
    report["timing_s"] = dict(timer.phases, total=round(time.monotonic() - timer.t0, 3))
    finish_projection(report)
    timer.lap("projection")
    series = report.pop("_series", {})
    report["complete"] = True
    report["charts"] = []
    if out_dir is not None:
        write_outputs(report, out_dir, series)
    return report


def write_outputs(report: dict, out_dir: str, series: dict) -> None:
    """audit.json (written last, atomically) and the per-broker rate chart."""
    os.makedirs(out_dir, exist_ok=True)
    charts = []
    if series:
        charts.append(rates_png(series, report["brokers"]["window_ms"], os.path.join(out_dir, "broker_rates.png")))
    report["charts"] = charts
    tmp = os.path.join(out_dir, ".audit.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, "audit.json"))
