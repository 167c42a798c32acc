"""``pidctl audit ...``: export to Parquet and the Spark audit job; and the job's own command line
under spark-submit (``submit_main``: ``spark-submit cli/audit.py --input DIR ...``)."""
from __future__ import annotations

if __name__ == "__main__" and __package__ in (None, ""):  # spark-submit cli/audit.py: the repo importable,
    import os as _os                                          # and this file's relative imports cli's (PEP 366)
    import sys as _sys
    _sys.path.insert(0, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    __package__ = "cli"

import argparse
import json
import os
import sys
import time

import click

from chaos.audit.inputs import AuditInputError
from chaos.audit.job import EXAMPLES, PHASES, WINDOW_MS, run_audit
from chaos.audit.report import render_summary
from chaos.audit.spark import SparkSetupError

from . import render
from .common import EXIT_ANOMALY, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, handle_errors, output_option
from .progress import Bar


@click.group()
def audit():
    """The audit pipeline: audit trails and chaos histories as Parquet, checked on Spark."""


@audit.command("export")
@click.option("--from", "src", required=True, type=click.Path(),
              help="A local cluster, a node data directory, a chaos run directory, or a directory holding them.")
@click.option("--to", "dest", required=True, type=click.Path(),
              help="Output directory (new or empty): records/, gaps/, chaos/ and manifest.json.")
@click.option("--force", is_flag=True, help="Allow a non-empty --to; a previous export there is replaced.")
@output_option
@handle_errors
def audit_export(src, dest, force, output):
    """Convert audit trails (msgpack) and chaos histories to typed Parquet for `pidctl audit run`."""

    from chaos.audit.export import export  # heavy (pyarrow): imported when used

    t0 = time.monotonic()
    manifest = export(src, dest, force=force)
    elapsed = time.monotonic() - t0
    rows = sum(t["rows"] for t in manifest["tables"].values())
    for s in manifest["sources"]:
        if s["counts"].get("torn_tail_bytes"):
            render.warn(f"{s['path']}: an audit trail ends in a torn line ({s['counts']['torn_tail_bytes']} bytes, "
                        "not exported): a node crashed mid-append or is still running")
    if output == "json":
        render.emit_json({**manifest, "rows": rows, "elapsed_s": round(elapsed, 3)})
        return
    render.table(f"audit export to {dest}", ["source", "kind", "nodes", "audit lines", "gaps", "history ops",
                                              "allocate ok", "generate ok"],
                 [[s["name"], s["kind"], s["counts"].get("nodes"), s["counts"].get("audit_lines"),
                   s["counts"].get("gaps"), s["counts"].get("history_ops"), s["counts"].get("allocate_ok"),
                   s["counts"].get("generate_ok")] for s in manifest["sources"]])
    render.line(f"{len(manifest['tables'])} files, {rows} rows in {elapsed:.1f}s "
                f"({rows / max(elapsed, 1e-9):,.0f} rows/s); manifest {os.path.join(dest, 'manifest.json')}")


@audit.command("run")
@click.option("--input", "input_dir", required=True, type=click.Path(), help="An export of `pidctl audit export`.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master: local[N] (embedded in this process) or spark://HOST:PORT.")
@click.option("--out", "out_dir", default="audit-report", show_default=True, type=click.Path(file_okay=False),
              help="Where audit.json and the PNG charts go.")
@click.option("--window-ms", type=click.IntRange(1000), default=WINDOW_MS, show_default=True,
              help="Time window of the per-broker allocation rates.")
@click.option("--examples", type=click.IntRange(1, 10_000), default=EXAMPLES, show_default=True,
              help="Findings listed per check (every check also counts all of them).")
@click.option("--per-source", is_flag=True,
              help="Compare blocks only within each exported source (an export of several unrelated "
                   "clusters); by default all cluster and node sources are one ID space.")
@output_option
def audit_run(input_dir, master, out_dir, window_ms, examples, per_source, output):
    """Check the whole exported history on Spark: overlaps, duplicate PIDs, migration boundary, gaps,
    per-broker rates and restart loops, ID-space projection.  Exit 0 clean, 5 on violations, 1 on bad input.
    On a terminal, stderr shows the phase running (reading inputs, the Spark job, the checks)."""

    try:
        with Bar("audit", total=len(PHASES)) as bar:  # on a terminal only: stderr, gone when done
            report = run_audit(input_dir, master=master, out_dir=out_dir, window_ms=window_ms, examples=examples,
                               id_spaces="source" if per_source else "cluster",
                               progress=lambda i, phase: bar.update(completed=i, note=phase))
    except (AuditInputError, SparkSetupError) as e:
        render.error(str(e))
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    if output == "json":
        render.emit_json(report)
    else:
        render_summary(report, render.console())
        render.line(f"report: {os.path.join(out_dir, 'audit.json')}")
    if not report["valid"]:
        sys.exit(EXIT_ANOMALY)


def submit_main(argv: list[str] | None = None) -> int:
    """``spark-submit cli/audit.py --input DIR [--out DIR] [--json] ...`` (or ``python cli/audit.py``): the
    audit as a Spark application, with plain argparse options (spark-submit passes them through).  The
    master is spark-submit's (run directly: ``--master``, default local[*]).  Returns the exit code: 0
    clean, 1 on bad input or no Spark, 5 on violations."""
    p = argparse.ArgumentParser(prog="cli/audit.py", description="The audit job on Spark: was any producer ID "
                                "issued twice, over the whole exported history?")
    p.add_argument("--input", required=True, help="directory written by pidctl audit export")
    p.add_argument("--out", help="write audit.json and charts here")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")
    p.add_argument("--examples", type=int, default=EXAMPLES)
    p.add_argument("--window-ms", type=int, default=WINDOW_MS)
    p.add_argument("--per-source", action="store_true", help="one ID space per exported source")
    a = p.parse_args(argv)
    # Under spark-submit the master comes from it; run directly, the default is local[*].
    master = a.master or (None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*]")
    try:
        report = run_audit(a.input, master=master, out_dir=a.out, examples=a.examples, window_ms=a.window_ms,
                           id_spaces="source" if a.per_source else "cluster")
    except (AuditInputError, SparkSetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        render_summary(report)
    return EXIT_OK if report["valid"] else EXIT_ANOMALY


if __name__ == "__main__":  # spark-submit cli/audit.py
    sys.exit(submit_main())
