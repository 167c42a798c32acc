"""The audit job on Spark: was any producer ID issued twice, over the whole exported history?

Input: a directory written by ``pidctl audit export`` (``manifest.json``,
``records/<RecordName>/part-*.parquet``, ``chaos/allocate``, ``chaos/generate``).
Run it with ``pidctl audit run --input DIR`` (local Spark in the process), or on a
cluster with ``spark-submit audit/job.py --input DIR --out DIR`` (only the driver
needs pidquorum: the job is DataFrame operations and window functions, no Python
runs on executors; DIR must be on a file system the driver and executors share).

Checks (each gives an exact count and the first ``examples`` findings):

* overlaps between any two issued blocks of one ID space (a ``source`` of the
  export): quorum blocks (accepted ``AllocateProducerIdsRecord``), ZooKeeper-era
  blocks (``[zk_block_start, zk_block_end]`` of accepted seeds) and blocks
  acknowledged in chaos runs;
* duplicate producer IDs among those handed out one by one in chaos runs;
* the migration boundary: the first quorum block after a seed starts above the
  ZooKeeper block (``start > zk_block_end``);
* gaps between consecutive blocks of the ID space and the IDs they waste;
* per-broker allocation rate per time window, and brokers that look like a
  restart loop (KIP-936): many registrations or broker epochs in one window, or
  a window far above the fleet's median rate;
* when the ID space (up to 2**63-2) runs out at the observed rate.

How overlaps are found (``_main_pass``)
---------------------------------------
Sort every block by start; a block overlaps some block that starts at or before
it if and only if its start is below the running maximum of the ends of all
blocks before it in that order.  (If block A comes before B and they overlap,
then A.start <= B.start < A.end <= running max; conversely the block holding the
running maximum starts at or before B and ends after B.start.)  Comparing with
the previous block only would miss a block nested inside an earlier, larger one
with smaller blocks in between; the running maximum does not, and an identical
copy of a block is caught like any other (its start is below the first copy's end).

To spread that scan over cores, the ID space is cut into buckets of about
8,000 blocks each (piecewise-uniform buckets from the Parquet footers' min/max
statistics, so a skewed ID space still balances).  A window function
partitioned by bucket and ordered by start computes the running maximum inside
each bucket; what comes before a bucket is summarised by one *carry* row placed
first in the bucket: the greatest end among all blocks of earlier buckets (from
a cheap aggregation pass and a prefix maximum over bucket summaries in the
driver; an example that names that block looks it up by its end).  So the running maximum inside a bucket is exactly the global one, for
blocks spanning any number of buckets, with one shuffle and no replication.

The same ordered pass removes the copies of one record written by each node
(same Raft index, position and content: adjacent in that order), flags records
the nodes disagree on (``accepted`` differs), and drops a chaos acknowledgement
of a block that an accepted record of the same source already issued (a chaos
run exported together with its cluster's audit trail sees every block twice;
a second acknowledgement of the same block still counts as an overlap).  The
running maximum needs none of that: copies and acknowledgements carry their
record's own end and sort right after it.

ID spaces (``id_spaces``)
------------------------
Blocks are compared within an ID space, and by default every source of kind
``cluster`` or ``node`` (a local cluster, a node's data directory: one
production cluster's history, maybe copied from each of its hosts) is one
ID space, so an overlap between blocks found in two different directories is
found too, and the copies of one record kept by every node are one block.  A
chaos run (kind ``chaos``) is its own ID space: each run starts its own
throwaway cluster at ID 0.  A source whose kind the manifest does not give is
its own ID space.  ``id_spaces="source"`` (``pidctl audit run --per-source``)
makes every source its own ID space, for an export that holds several
unrelated clusters.  The report names the ID spaces and their sources.

Cost and scale-out
------------------
Per run: the Parquet footers (driver: schema, value checks from min/max
statistics -- the rows of a row group are read only when its statistics cannot
clear it -- and bucket edges); one aggregation pass (max end per bucket, a few
bytes per bucket to the driver); one shuffle of narrow rows hash-partitioned
by bucket, sorted, one window operator, then an aggregation per (broker,
epoch, time window) that keeps each finding as its own group; then small jobs
on that persisted summary.  Buckets are independent tasks of ~8k rows, so on a
cluster the scan and the ordered pass spread over every executor core, and the
driver only sees one row per bucket and per (broker, window).  Shuffle
partitions grow with the input (~1 per 1.25M rows, ``audit.spark.tune_for_rows``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

if __name__ == "__main__" and __package__ in (None, ""):  # spark-submit audit/job.py: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from records.schema import BY_NAME, LONG_MAX  # noqa: E402

FORMAT = 1
ID_MAX = LONG_MAX - 1  # the last usable producer ID (2**63-2)
EXAMPLES = 10
WINDOW_MS = 60_000
BUCKET_ROWS = 8192      # target blocks per ID-space bucket (one window group)
MAX_BUCKETS = 16384
MAX_SEGMENTS = 64
RESTART_REGISTRATIONS = 3   # registrations of one broker in one window that look like a restart loop
RESTART_EPOCHS = 3          # distinct broker epochs in one window's allocations
RATE_FACTOR = 10.0          # a window this many times the fleet's median rate...
RATE_MIN_BLOCKS = 10        # ...and at least this many blocks
CHART_BROKERS = 8

# Exit codes of ``main`` (the same as pidctl's).
EXIT_OK, EXIT_ERROR, EXIT_VIOLATIONS = 0, 1, 5

ZK, QUORUM, CHAOS = 0, 1, 2
CARRIED = 9  # a carry row: the block with the greatest end in earlier buckets, identified later
KIND_NAMES = {ZK: "zookeeper", QUORUM: "quorum", CHAOS: "chaos"}
ISSUED, REFUSED, ACK, DISAGREE = 0, 1, 2, 3


class AuditInputError(Exception):
    """The input is missing, incomplete or malformed; ``path`` and ``column`` say where (when known)."""

    def __init__(self, message: str, path: str | None = None, column: str | None = None):
        self.path = path
        self.column = column
        where = path or ""
        if column:
            where += f": column {column}"
        super().__init__(f"{where}: {message}" if where else message)


# --------------------------------------------------------------------------
# The input's tables, described once
# --------------------------------------------------------------------------

_SPEC_TYPES = {"int32": ("int32",), "int64": ("int64",), "bool": ("bool",), "string": ("string", "large_string"),
               "nullable_string": ("string", "large_string")}
_INT = ("int8", "int16", "int32", "int64")  # chaos columns: the exporter picks the narrowest that holds the range
_SPARK_TYPES = {"int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint", "bool": "boolean", "string": "string", "large_string": "string"}

BASE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("source", "string"), ("node_id", "int32"), ("raft_index", "int64"), ("raft_term", "int64"),
    ("position", "int32"), ("accepted", "bool"), ("error", "nullable_string"))


@dataclass(frozen=True)
class Rule:
    """A value check.  kind: 'min' (column >= value), 'lt' (column < value), 'sum_le' (column + other <= value),
    'ge_col' (column >= other)."""
    kind: str
    column: str
    value: int = 0
    other: str | None = None
    problem: str = ""


@dataclass(frozen=True)
class TableSpec:
    relpath: str
    columns: tuple[tuple[str, tuple[str, ...], bool], ...]  # (name, accepted arrow types, nullable)
    rules: tuple[Rule, ...]


def _record_table(name: str, rules: tuple[Rule, ...]) -> TableSpec:
    cols = [(n, _SPEC_TYPES[t], t == "nullable_string") for n, t in BASE_COLUMNS]
    cols += [(f.name, _SPEC_TYPES[f.type], f.type == "nullable_string") for f in BY_NAME[name].fields]
    base = (Rule("min", "raft_index", 0, problem="negative Raft index"),
            Rule("min", "position", 0, problem="negative position"))
    return TableSpec(f"records/{name}", tuple(cols), base + rules)


_TS = Rule("min", "timestamp_ms", -1, problem="timestamp below -1 (-1 means unknown)")
TABLES: dict[str, TableSpec] = {
    "alloc": _record_table("AllocateProducerIdsRecord", (
        Rule("min", "producer_id_start", 0, problem="negative producer ID"),
        Rule("min", "producer_id_len", 1, problem="block length below 1"),
        Rule("sum_le", "producer_id_start", LONG_MAX, "producer_id_len",
             "block end overflows int64 (producer_id_start + producer_id_len > 2**63-1)"),
        _TS)),
    "seed": _record_table("ProducerIdSeedRecord", (
        Rule("min", "next_producer_id", 0, problem="negative producer ID"),
        Rule("min", "zk_block_start", 0, problem="negative producer ID"),
        Rule("ge_col", "zk_block_end", 0, "zk_block_start", "zk_block_end below zk_block_start"),
        Rule("lt", "zk_block_end", LONG_MAX, problem="zk_block_end is 2**63-1: the block's end overflows int64"),
        _TS)),
    "register": _record_table("RegisterBrokerRecord", (
        Rule("min", "broker_epoch", 0, problem="negative broker epoch"), _TS)),
    "reservation": _record_table("BridgeReservationRecord", (
        Rule("min", "reserved_start", 0, problem="negative producer ID"),
        Rule("ge_col", "reserved_end", 0, "reserved_start", "reserved_end below reserved_start"), _TS)),
    "chaos_allocate": TableSpec("chaos/allocate", (
        ("source", _SPEC_TYPES["string"], False), ("process", _SPEC_TYPES["string"], False),
        ("owner", _SPEC_TYPES["string"], False), ("index", _INT, False), ("time_ns", _INT, False),
        ("broker_id", _INT, False), ("broker_epoch", _INT, False), ("start", _INT, False), ("length", _INT, False)), (
        Rule("min", "index", 0, problem="negative op index"),
        Rule("min", "start", 0, problem="negative producer ID"),
        Rule("min", "length", 1, problem="block length below 1"),
        Rule("sum_le", "start", LONG_MAX, "length", "block end overflows int64 (start + length > 2**63-1)"))),
    "chaos_generate": TableSpec("chaos/generate", (
        ("source", _SPEC_TYPES["string"], False), ("process", _SPEC_TYPES["string"], False),
        ("owner", _SPEC_TYPES["string"], False), ("index", _INT, False), ("time_ns", _INT, False),
        ("pid", _INT, False)), (
        Rule("min", "index", 0, problem="negative op index"),
        Rule("min", "pid", 0, problem="negative producer ID"))),
}
START_COLUMN = {"alloc": "producer_id_start", "seed": "zk_block_start", "chaos_allocate": "start"}


@dataclass
class Table:
    name: str
    spec: TableSpec
    files: list[str] = field(default_factory=list)
    rows: int = 0
    types: dict[str, str] = field(default_factory=dict)   # column -> arrow type name found
    pieces: list[tuple[int, int, int]] | None = field(default_factory=list)  # (min start, max start, rows) per row group

    def spark_schema(self) -> str:
        return ", ".join(f"`{c}` {_SPARK_TYPES[self.types[c]]}" for c, _, _ in self.spec.columns)


# --------------------------------------------------------------------------
# Reading and validating the input (driver side, Parquet footers)
# --------------------------------------------------------------------------

def _rel(input_dir: str, path: str) -> str:
    return os.path.relpath(path, input_dir)


def load_manifest(input_dir: str) -> dict:
    if not os.path.exists(input_dir):
        raise AuditInputError("no such directory", input_dir)
    if not os.path.isdir(input_dir):
        raise AuditInputError("not a directory", input_dir)
    if not os.listdir(input_dir):
        raise AuditInputError("empty directory: nothing was exported here", input_dir)
    path = os.path.join(input_dir, "manifest.json")
    if not os.path.isfile(path):
        raise AuditInputError("no manifest.json: an incomplete export (pidctl audit export writes it last); "
                              "refusing to audit a partial history", input_dir)
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise AuditInputError(f"unreadable manifest: {e}", path) from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise AuditInputError(f"not a format-{FORMAT} audit export manifest "
                              f"(format {m.get('format') if isinstance(m, dict) else None!r})", path)
    if not isinstance(m.get("tables"), dict):
        raise AuditInputError("manifest has no 'tables' object", path)
    for k, v in m["tables"].items():
        if not isinstance(v, dict) or type(v.get("rows")) is not int or v["rows"] < 0:
            raise AuditInputError(f"manifest entry {k!r} has no row count", path)
    return m


def _manifest_rows(manifest: dict, relpath: str) -> int | None:
    """Rows the manifest lists for a table (its directory or files under it); None if not listed."""
    total, seen = 0, False
    for key, v in manifest["tables"].items():
        k = key.replace("\\", "/").strip("/")
        if k == relpath or k.startswith(relpath + "/"):
            total += v["rows"]
            seen = True
    return total if seen else None


def _check_file_schema(input_dir: str, t: Table, path: str, schema) -> None:
    import pyarrow as pa

    rel = _rel(input_dir, path)
    names = set(schema.names)
    for col, allowed, _ in t.spec.columns:
        if col not in names:
            raise AuditInputError(f"missing (expected {' or '.join(allowed)})", rel, col)
        typ = schema.field(col).type
        found = ("large_string" if pa.types.is_large_string(typ) else "string" if pa.types.is_string(typ)
                 else "bool" if pa.types.is_boolean(typ) else str(typ))
        if found not in allowed:
            raise AuditInputError(f"type {typ}, expected {' or '.join(allowed)}", rel, col)
        prev = t.types.setdefault(col, found)
        if _SPARK_TYPES[prev] != _SPARK_TYPES[found]:
            raise AuditInputError(f"type {typ}, but other files of {t.spec.relpath} have {prev}", rel, col)


def _violation(rule: Rule, mins: dict, maxs: dict) -> bool | None:
    """Can the row group break ``rule``?  False: provably not (from min/max); True: provably yes; None: maybe."""
    c, o = rule.column, rule.other
    if c not in mins or (o is not None and o not in mins):
        return None
    if rule.kind == "min":
        return mins[c] < rule.value
    if rule.kind == "lt":
        return None if maxs[c] >= rule.value else False
    if rule.kind == "sum_le":
        return None if maxs[c] + maxs[o] > rule.value else False
    if rule.kind == "ge_col":
        return None if mins[c] < maxs[o] else False
    raise ValueError(rule.kind)


def _first_bad_row(pf, rg: int, rule: Rule, offset: int) -> tuple[int, Any] | None:
    import numpy as np

    cols = [rule.column] + ([rule.other] if rule.other else [])
    tb = pf.read_row_group(rg, columns=cols)
    a = tb.column(rule.column).to_numpy(zero_copy_only=False).astype(object if rule.kind == "sum_le" else np.int64)
    if rule.kind == "min":
        bad = a < rule.value
    elif rule.kind == "lt":
        bad = a >= rule.value
    elif rule.kind == "sum_le":
        b = tb.column(rule.other).to_numpy(zero_copy_only=False).astype(object)
        bad = np.array([x + y > rule.value for x, y in zip(a, b)], dtype=bool)
        a = [f"{x} + {y}" for x, y in zip(a, b)]
    else:
        b = tb.column(rule.other).to_numpy(zero_copy_only=False).astype(np.int64)
        bad = a < b
        a = [f"{x} < {y}" for x, y in zip(a, b)]
    idx = np.flatnonzero(bad)
    if not len(idx):
        return None
    return offset + int(idx[0]), a[int(idx[0])]


def scan_table(input_dir: str, manifest: dict, name: str) -> Table:
    """Find a table's files, check every file's schema, its values (footer statistics first, then the
    rows of any row group the statistics cannot clear) and its row count against the manifest."""
    import pyarrow.parquet as pq

    spec = TABLES[name]
    t = Table(name, spec)
    d = os.path.join(input_dir, *spec.relpath.split("/"))
    listed = _manifest_rows(manifest, spec.relpath)
    if os.path.isdir(d):
        t.files = sorted(os.path.join(d, f) for f in os.listdir(d)
                         if f.endswith(".parquet") and not f.startswith((".", "_")))
    elif os.path.exists(d):
        raise AuditInputError("not a directory", _rel(input_dir, d))
    if t.files and listed is None:
        raise AuditInputError("files not listed in manifest.json (a different or unfinished export?)", spec.relpath)
    if listed and not t.files:
        raise AuditInputError(f"manifest.json lists {listed} rows but there are no Parquet files", spec.relpath)
    start_col = START_COLUMN.get(name)
    nonnull = [c for c, _, nullable in spec.columns if not nullable]
    for path in t.files:
        rel = _rel(input_dir, path)
        try:
            pf = pq.ParquetFile(path)
            meta = pf.metadata
            schema = pf.schema_arrow
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise AuditInputError(f"not a readable Parquet file ({e})", rel) from None
        _check_file_schema(input_dir, t, path, schema)
        colidx = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
        offset = 0
        for rg in range(meta.num_row_groups):
            g = meta.row_group(rg)
            mins, maxs = {}, {}
            for col, _, nullable in spec.columns:
                st = g.column(colidx[col]).statistics
                if st is None:
                    continue
                if not nullable and st.null_count not in (None, 0):
                    raise AuditInputError(f"{st.null_count} null value(s) in a column that has no nulls", rel, col)
                if st.has_min_max and isinstance(st.min, int) and not isinstance(st.min, bool):
                    mins[col], maxs[col] = st.min, st.max
            if any(g.column(colidx[c]).statistics is None for c in nonnull) and g.num_rows:
                tb = pf.read_row_group(rg, columns=nonnull)
                for c in nonnull:
                    if tb.column(c).null_count:
                        raise AuditInputError(f"{tb.column(c).null_count} null value(s) in a column that has no nulls",
                                              rel, c)
            for rule in spec.rules:
                if g.num_rows == 0 or _violation(rule, mins, maxs) is False:
                    continue
                bad = _first_bad_row(pf, rg, rule, offset)
                if bad is not None:
                    raise AuditInputError(f"{rule.problem} (row {bad[0]}: {bad[1]})", rel, rule.column)
            if start_col is not None and t.pieces is not None and g.num_rows:
                if start_col in mins:
                    t.pieces.append((mins[start_col], maxs[start_col], g.num_rows))
                else:
                    t.pieces = None  # no statistics: buckets from a Spark pass instead
            offset += g.num_rows
        t.rows += meta.num_rows
    if listed is not None and listed != t.rows:
        raise AuditInputError(f"manifest.json lists {listed} rows, the files hold {t.rows}: an incomplete or "
                              "mixed export", spec.relpath)
    if not t.files:
        for col, allowed, _ in spec.columns:
            t.types[col] = allowed[0]
    return t


# --------------------------------------------------------------------------
# ID-space buckets
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Buckets:
    """Piecewise-uniform buckets: segment k covers [lo_k, lo_{k+1}) in ``nsub`` equal sub-buckets."""
    los: tuple[int, ...]
    widths: tuple[int, ...]
    nsub: int

    @property
    def count(self) -> int:
        return len(self.los) * self.nsub

    def add_to(self, df, col: str = "start", name: str = "bucket"):
        """``df`` with the bucket of ``col``: a binary CASE tree picks the segment (integer leaves, so the
        generated code stays small enough for the JIT to compile it), then one division."""
        from pyspark.sql import functions as F

        def tree(i: int, j: int) -> str:
            if j - i == 1:
                return str(i + 1)
            m = (i + j) // 2
            return f"CASE WHEN {col} < {self.los[m]}L THEN {tree(i, m)} ELSE {tree(m, j)} END"
        k = f"_{name}_segment"
        los = f"array({', '.join(f'{x}L' for x in self.los)})"
        widths = f"array({', '.join(f'{x}L' for x in self.widths)})"
        df = df.withColumn(k, F.expr(tree(0, len(self.los))))
        return df.withColumn(name, F.expr(
            f"CAST(({k} - 1) * {self.nsub} + LEAST(GREATEST({col} - element_at({los}, {k}), 0L) "
            f"DIV element_at({widths}, {k}), {self.nsub - 1}L) AS INT)")).drop(k)

    def of(self, x: int) -> int:  # the same function in Python (tests)
        k = max(0, sum(1 for lo in self.los[1:] if x >= lo))
        return k * self.nsub + min(max(x - self.los[k], 0) // self.widths[k], self.nsub - 1)


def plan_buckets(pieces: list[tuple[int, int, int]], total: int, buckets: int | None = None) -> Buckets:
    """Buckets of about equal row counts from (min, max, rows) pieces (row-group statistics): the rows are
    taken as spread uniformly over each piece; segment edges are quantiles of that mixture."""
    if not pieces:
        return Buckets((0,), (1,), 1)
    n_buckets = buckets or max(1, min(MAX_BUCKETS, -(-total // BUCKET_ROWS)))
    lo_all = min(p[0] for p in pieces)
    hi_all = max(p[1] for p in pieces) + 1
    k = max(1, min(MAX_SEGMENTS, n_buckets))
    points = sorted({p[0] for p in pieces} | {p[1] + 1 for p in pieces})
    weight = sum(p[2] for p in pieces)

    def cdf(x: int) -> float:
        s = 0.0
        for lo, hi, n in pieces:
            if x >= hi + 1:
                s += n
            elif x > lo:
                s += n * (x - lo) / (hi + 1 - lo)
        return s

    cs = [cdf(x) for x in points]
    edges = [lo_all]
    for q in range(1, k):
        target = weight * q / k
        for i in range(1, len(points)):
            if cs[i] >= target:
                a, b, ca, cb = points[i - 1], points[i], cs[i - 1], cs[i]
                x = b if cb == ca else a + int((target - ca) / (cb - ca) * (b - a))
                break
        else:
            x = hi_all
        if edges[-1] < x < hi_all:
            edges.append(x)
    nsub = max(1, n_buckets // len(edges))
    bounds = edges + [hi_all]
    widths = tuple(max(1, -(-(bounds[i + 1] - bounds[i]) // nsub)) for i in range(len(edges)))
    return Buckets(tuple(edges), widths, nsub)


# --------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------

@dataclass
class Options:
    examples: int = EXAMPLES
    window_ms: int = WINDOW_MS
    buckets: int | None = None            # force the number of ID-space buckets (tests)
    restart_registrations: int = RESTART_REGISTRATIONS
    restart_epochs: int = RESTART_EPOCHS
    rate_factor: float = RATE_FACTOR
    rate_min_blocks: int = RATE_MIN_BLOCKS
    id_spaces: str = "cluster"            # "cluster": cluster and node sources share one; "source": one each


class _Timer:
    def __init__(self):
        self.t0 = time.monotonic()
        self.last = self.t0
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.last, 3)
        self.last = now


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


def _read(spark, t: Table):
    if not t.files:
        return spark.createDataFrame([], t.spark_schema())
    return spark.read.schema(t.spark_schema()).parquet(*t.files)


def run_audit(input_dir: str, master: str = "local[*]", out_dir: str | None = None, *, spark=None,
              options: Options | None = None, **kw) -> dict:
    """Audit an export directory; returns the report (also ``out_dir/audit.json`` and PNG charts if
    ``out_dir``).  ``spark``: an existing SparkSession (else one is started for ``master`` and stopped
    afterwards).  Keyword arguments override ``Options`` fields.  Raises ``AuditInputError`` on bad
    input, before anything is written; a stale ``audit.json`` in ``out_dir`` is removed first, so a
    failed run never leaves a report that looks complete."""
    opts = options or Options()
    for k, v in kw.items():
        if not hasattr(opts, k):
            raise TypeError(f"unknown option {k!r}")
        setattr(opts, k, v)
    timer = _Timer()
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

    from .spark import spark_session, tune_for_rows

    own = False
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:  # start one for this run, and stop it afterwards
            spark = spark_session(master)
            own = True
    timer.lap("spark_start")
    try:
        partitions = tune_for_rows(spark, block_rows + tables["chaos_generate"].rows)
        spaces = id_spaces(manifest, opts.id_spaces)
        report = _Job(spark, input_dir, tables, opts, timer, spaces).run()
    finally:
        if own:
            spark.stop()
    report["spark"] = {"master": master if own else spark.sparkContext.master, "version": spark.version,
                       "shuffle_partitions": partitions, "buckets": report.pop("_buckets")}
    grouped: dict[str, list[str]] = {}
    for name, space in spaces.items():
        grouped.setdefault(space, []).append(name)
    report["id_spaces"] = {"mode": opts.id_spaces, "spaces": {k: sorted(v) for k, v in sorted(grouped.items())}}
    report["input"] = {"dir": os.path.abspath(input_dir), "sources": manifest.get("sources", []),
                       "tables": {t.spec.relpath: {"files": len(t.files), "rows": t.rows} for t in tables.values()}}
    report["timing_s"] = dict(timer.phases, total=round(time.monotonic() - timer.t0, 3))
    finish_projection(report)
    series = report.pop("_series", {})
    report["complete"] = True
    report["charts"] = []
    if out_dir is not None:
        write_outputs(report, out_dir, series)
    return report


def write_outputs(report: dict, out_dir: str, series: dict) -> None:
    """audit.json (written last, atomically) and the per-broker rate chart."""
    from .report import rates_png

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


class _Job:
    def __init__(self, spark, input_dir: str, tables: dict[str, Table], opts: Options, timer: _Timer,
                 spaces: dict[str, str] | None = None):
        self.spark = spark
        self.input_dir = input_dir
        self.t = tables
        self.o = opts
        self.timer = timer
        self.df = {name: _read(spark, t) for name, t in tables.items()}
        renamed = {k: v for k, v in (spaces or {}).items() if k != v}
        if renamed:  # from here on, "source" is the ID space: every check groups by it
            from pyspark.sql import functions as F

            pairs = [F.lit(x) for kv in sorted(renamed.items()) for x in kv]
            space = F.coalesce(F.element_at(F.create_map(*pairs), F.col("source")), F.col("source"))
            self.df = {name: df.withColumn("source", space) for name, df in self.df.items()}
        self.sources: list[str] = []

    # ------------------------------------------------------------ blocks
    def _blocks(self):
        """Every block row of every table, one schema: kind, start, end (exclusive), who, where."""
        from pyspark.sql import functions as F

        a, s, c = self.df["alloc"], self.df["seed"], self.df["chaos_allocate"]
        cols = ["source", "kind", "start", "end", "broker_id", "broker_epoch", "ref", "pos", "accepted", "ts"]
        q = a.select("source", F.lit(QUORUM).alias("kind"), F.col("producer_id_start").alias("start"),
                     (F.col("producer_id_start") + F.col("producer_id_len").cast("bigint")).alias("end"),
                     F.col("broker_id").cast("int").alias("broker_id"), F.col("broker_epoch").cast("bigint"),
                     F.col("raft_index").alias("ref"), F.col("position").alias("pos"), "accepted",
                     F.col("timestamp_ms").alias("ts"))
        z = s.select("source", F.lit(ZK).alias("kind"), F.col("zk_block_start").alias("start"),
                     (F.col("zk_block_end") + F.lit(1)).alias("end"), F.col("zk_broker").cast("int").alias("broker_id"),
                     F.lit(-1).cast("bigint").alias("broker_epoch"), F.col("raft_index").alias("ref"),
                     F.col("position").alias("pos"), "accepted", F.col("timestamp_ms").alias("ts"))
        ch = c.select("source", F.lit(CHAOS).alias("kind"), F.col("start").cast("bigint").alias("start"),
                      (F.col("start").cast("bigint") + F.col("length").cast("bigint")).alias("end"),
                      F.col("broker_id").cast("int").alias("broker_id"),
                      F.col("broker_epoch").cast("bigint").alias("broker_epoch"),
                      F.col("index").cast("bigint").alias("ref"), F.lit(0).alias("pos"), F.lit(True).alias("accepted"),
                      F.lit(-1).cast("bigint").alias("ts"))
        parts = [df for name, df in (("alloc", q), ("seed", z), ("chaos_allocate", ch)) if self.t[name].rows]
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out.select(*cols)

    def _plan_buckets(self) -> Buckets:
        from pyspark.sql import functions as F

        names = [n for n in ("alloc", "seed", "chaos_allocate") if self.t[n].rows]
        total = sum(self.t[n].rows for n in names)
        if all(self.t[n].pieces is not None for n in names):
            pieces = [p for n in names for p in self.t[n].pieces]
        else:  # a file without statistics: one uniform segment from a min/max pass
            r = self._blocks().agg(F.min("start"), F.max("start")).collect()[0]
            pieces = [(r[0], r[1], total)]
        return plan_buckets(pieces, total, self.o.buckets)

    def run(self) -> dict:
        rep: dict[str, Any] = {"format": FORMAT}
        has_blocks = any(self.t[n].rows for n in ("alloc", "seed", "chaos_allocate"))
        buckets = self._plan_buckets() if has_blocks else Buckets((0,), (1,), 1)
        rep["_buckets"] = buckets.count
        if has_blocks:
            blocks = buckets.add_to(self._blocks())
            carry = self._carry_pass(blocks)
            self.timer.lap("carry_pass")
            R = self._main_pass(blocks, carry, buckets)
            self.timer.lap("main_pass")
            rep.update(self._block_results(R))
            self.timer.lap("block_results")
            rep["checks"]["migration_boundary"] = self._boundary()
        else:
            rep.update(self._empty_block_results())
            rep["checks"]["migration_boundary"] = {"count": 0, "seeds": 0, "examples": []}
        self.timer.lap("boundary")
        rep["checks"]["duplicate_pids"] = self._duplicate_pids()
        self.timer.lap("duplicate_pids")
        rep["brokers"], series, projections = self._brokers(R if has_blocks else None)
        self.timer.lap("brokers")
        for src, p in projections.items():
            rep["id_space"].setdefault(src, {}).update(p)
        rep["_series"] = series
        rep["sources"] = self.sources
        checks = rep["checks"]
        rep["valid"] = not (checks["overlaps"]["count"] or checks["duplicate_pids"]["count"]
                            or checks["migration_boundary"]["count"])
        rep["violations"] = {k: checks[k]["count"] for k in ("overlaps", "duplicate_pids", "migration_boundary")}
        if has_blocks:
            R.unpersist()
        return rep

    # ------------------------------------------------------------ pass 1: carry rows
    def _carry_pass(self, blocks) -> list[tuple[int, int, int]]:
        """Per (source, bucket), the greatest end of an accepted block; then, per bucket, the greatest of all
        earlier buckets of the same source: the carry row that goes first into the bucket's window.
        (Only the end: a maximum over a struct would force a sort-based aggregation.  The carried block
        is looked up by its end when an example names it, see ``_resolve_carried``.)"""
        from pyspark.sql import functions as F

        agg = (blocks.groupBy("source", "bucket")
               .agg(F.max(F.when(F.col("accepted"), F.col("end"))).alias("m"))
               .collect())
        self.sources = sorted({r["source"] for r in agg})
        index = {s: i for i, s in enumerate(self.sources)}
        carry = []
        best: dict[str, int] = {}
        for r in sorted(agg, key=lambda r: (r["source"], r["bucket"])):
            src = r["source"]
            b = best.get(src)
            if b is not None:
                carry.append((index[src], r["bucket"], b))
            if r["m"] is not None and (b is None or r["m"] > b):
                best[src] = r["m"]
        return carry

    # ------------------------------------------------------------ pass 2: the ordered scan
    def _main_pass(self, blocks, carry: list[tuple], buckets: Buckets):
        from pyspark.sql import Window as W
        from pyspark.sql import functions as F

        o = self.o
        nb = buckets.count
        if len(self.sources) <= 64:
            src_idx = None
            for i, name in enumerate(self.sources):
                src_idx = (F.when(F.col("source") == name, F.lit(i)) if src_idx is None
                           else src_idx.when(F.col("source") == name, F.lit(i)))
            rows = blocks.withColumn("src", src_idx)
        else:
            lookup = self.spark.createDataFrame(list(enumerate(self.sources)), "src int, source string")
            rows = blocks.join(F.broadcast(lookup), "source")
        # Narrow rows through the shuffle (every column costs 8 bytes a row): position and accepted share
        # "pa" = position * 2 + (0 if accepted else 1), which also sorts accepted copies first; the
        # time window replaces the timestamp; carry rows are kind CARRIED with start -1.
        win = F.when((F.col("kind") == QUORUM) & (F.col("ts") >= 0), F.expr(f"ts DIV {o.window_ms}L"))
        rows = rows.select((F.col("src").cast("bigint") * nb + F.col("bucket")).alias("g"), "start", "end",
                           "broker_id", "broker_epoch", "kind", "ref",
                           (F.col("pos").cast("bigint") * 2 + F.when(F.col("accepted"), 0).otherwise(1)).alias("pa"),
                           win.alias("win"))
        if carry:
            schema = ("g bigint, start bigint, end bigint, broker_id int, broker_epoch bigint, kind int, ref bigint, "
                      "pa bigint, win bigint")
            rows = rows.unionByName(self.spark.createDataFrame(
                [(src * nb + bucket, -1, end, -1, -1, CARRIED, -1, 0, None) for src, bucket, end in carry], schema))

        w = W.partitionBy("g").orderBy("start", "end", "broker_id", "broker_epoch", "kind", "ref", "pa")
        before = w.rowsBetween(W.unboundedPreceding, -1)
        lagged = ("start", "end", "broker_id", "broker_epoch", "kind", "ref", "pa")
        extra = [F.lag(c).over(w).alias(f"p_{c}") for c in lagged]
        accepted = F.col("pa") % 2 == 0
        content = F.struct("start", "end", "broker_id", "broker_epoch")
        with_chaos = self.t["chaos_allocate"].rows > 0
        if with_chaos:  # the content of the last accepted quorum record before this row
            extra.append(F.last(F.when((F.col("kind") == QUORUM) & accepted, content), ignorenulls=True)
                         .over(before).alias("lq"))
        # The running maximum needs no de-duplication: a node's copy of a record, a ZooKeeper block seeded
        # twice and a chaos acknowledgement of a record all have the record's own (end, start) and sort
        # after it, so they never change the maximum any later row sees.  So it shares one window operator
        # (one buffering of each bucket) with the lags.
        extra.append(F.max(F.when(accepted, F.struct(
            "end", "start", (-F.col("kind")).alias("nkind"), "ref", F.expr("CAST(pa DIV 2 AS INT)").alias("pos"),
            "broker_id", "broker_epoch"))).over(before).alias("pm"))
        x = rows.select("*", *extra)

        def p(c):
            return F.col(f"p_{c}")
        same = ((p("start") == F.col("start")) & (p("end") == F.col("end")) & (p("broker_id") == F.col("broker_id"))
                & (p("broker_epoch") == F.col("broker_epoch")))
        copy = same & (p("kind") == F.col("kind")) & (
            (F.col("kind") == ZK) | ((F.col("kind") == QUORUM) & (p("ref") == F.col("ref"))
                                     & (F.expr("p_pa DIV 2") == F.expr("pa DIV 2"))))
        if with_chaos:
            ack = ((F.col("kind") == CHAOS) & F.coalesce(F.col("lq") == content, F.lit(False))
                   & ~F.coalesce(same & (p("kind") == CHAOS), F.lit(False)))
        else:
            ack = F.lit(False)
        x = x.select("*", F.coalesce(copy, F.lit(False)).alias("copy"), F.coalesce(ack, F.lit(False)).alias("ack"))
        x = x.withColumn("issued", accepted & ~F.col("copy") & ~F.col("ack"))
        x = x.withColumn("disagree", F.col("copy") & (F.col("kind") == QUORUM) & (p("pa") % 2 != F.col("pa") % 2))
        x = x.filter((F.col("kind") != CARRIED) & (~F.col("copy") | F.col("disagree")))
        status = (F.when(F.col("disagree"), DISAGREE).when(F.col("ack"), ACK)
                  .when(F.col("issued"), ISSUED).otherwise(REFUSED))
        overlap = F.col("issued") & (F.col("start") < F.col("pm.end"))
        gap = F.when(F.col("issued") & (F.col("start") > F.col("pm.end")), F.col("start") - F.col("pm.end"))
        x = x.select(F.expr(f"CAST(g DIV {nb}L AS INT)").alias("src"), "kind", "start", "end", "broker_id",
                     "broker_epoch", "ref", F.expr("CAST(pa DIV 2 AS INT)").alias("pos"), "win", "pm",
                     status.alias("status"), F.coalesce(overlap, F.lit(False)).alias("overlap"), gap.alias("gap"))
        interesting = F.col("overlap") | F.col("gap").isNotNull() | (F.col("status") == DISAGREE)
        xid = F.when(interesting, F.struct("start", "end", "ref", "pos", "overlap", "gap", "pm"))
        R = (x.select("src", "kind", "status", "broker_id", "broker_epoch", "win", xid.alias("x"), "start", "end")
             .groupBy("src", "kind", "status", "broker_id", "broker_epoch", "win", "x")
             .agg(F.count(F.lit(1)).alias("n"),
                  # Long sums stay exact: the rows of a group without x are issued blocks that overlap no
                  # earlier block, so they are disjoint and their lengths add up to less than 2**63; a group
                  # with x is one block.  (Refused rows may overlap anything: not summed.)
                  F.sum(F.when(F.col("status") == ISSUED, F.col("end") - F.col("start"))).alias("ids"),
                  F.min("start").alias("min_start"), F.max("end").alias("max_end")))
        R = R.persist()
        R.count()
        return R

    # ------------------------------------------------------------ results from R
    def _describe(self, kind: int, start: int, end: int, broker: int, epoch: int, ref: int, pos: int) -> dict:
        d: dict[str, Any] = {"kind": KIND_NAMES[kind], "start": start, "end": end, "length": end - start,
                             "broker_id": broker}
        if kind == QUORUM:
            d.update(broker_epoch=epoch, raft_index=ref, position=pos)
        elif kind == ZK:
            d.update(seed_raft_index=ref, seed_position=pos)
        else:
            d.update(broker_epoch=epoch, op_index=ref)
        return d

    def _empty_block_results(self) -> dict:
        return {"blocks": {"issued": 0, "ids_issued": 0, "by_kind": {}, "refused_records": 0,
                           "chaos_acks_matched": 0},
                "checks": {"overlaps": {"count": 0, "ids_reissued": 0, "examples": []},
                           "node_disagreements": {"count": 0, "examples": []}},
                "gaps": {"count": 0, "wasted_ids": 0, "examples": []}, "id_space": {}}

    def _block_results(self, R) -> dict:
        from pyspark.sql import functions as F

        n_ex = self.o.examples
        tot = (R.groupBy("src", "kind", "status")
               .agg(F.sum("n").alias("n"), F.sum(F.col("ids").cast("decimal(38,0)")).alias("ids"),
                    F.min("min_start").alias("min_start"),
                    F.max("max_end").alias("max_end"),
                    F.sum(F.when(F.col("x.overlap"), F.col("n"))).alias("overlaps"),
                    F.sum(F.when(F.col("x.overlap"),
                                 (F.least(F.col("x.end"), F.col("x.pm.end")) - F.col("x.start"))
                                 .cast("decimal(20,0)"))).alias("reissued"),
                    F.sum(F.when(F.col("x.gap").isNotNull(), F.col("n"))).alias("gaps"),
                    F.sum(F.col("x.gap").cast("decimal(20,0)")).alias("wasted"))
               .collect())
        by_kind: dict[str, dict] = {}
        id_space: dict[str, dict] = {}
        issued = ids = refused = acks = disagree = overlaps = reissued = gaps = wasted = 0
        for r in tot:
            src = self.sources[r["src"]]
            if r["status"] == ISSUED:
                k = by_kind.setdefault(KIND_NAMES[r["kind"]], {"blocks": 0, "ids": 0})
                k["blocks"] += r["n"]
                k["ids"] += int(r["ids"])
                issued += r["n"]
                ids += int(r["ids"])
                overlaps += r["overlaps"] or 0
                reissued += int(r["reissued"] or 0)
                gaps += r["gaps"] or 0
                wasted += int(r["wasted"] or 0)
                s = id_space.setdefault(src, {"blocks": 0, "ids_issued": 0, "first_id": None, "next_id": None,
                                              "gaps": 0, "wasted_ids": 0})
                s["blocks"] += r["n"]
                s["ids_issued"] += int(r["ids"])
                s["first_id"] = r["min_start"] if s["first_id"] is None else min(s["first_id"], r["min_start"])
                s["next_id"] = r["max_end"] if s["next_id"] is None else max(s["next_id"], r["max_end"])
                s["gaps"] += r["gaps"] or 0
                s["wasted_ids"] += int(r["wasted"] or 0)
            elif r["status"] == REFUSED:
                refused += r["n"]
            elif r["status"] == ACK:
                acks += r["n"]
            else:
                disagree += r["n"]

        def examples(cond, limit):
            rows = (R.filter(cond).select("src", "kind", "broker_id", "broker_epoch", "status", "x", "n")
                    .orderBy("src", "x.start", "x.end", "kind", "x.ref", "x.pos").limit(limit).collect())
            return rows

        ov_ex = []
        if overlaps:
            for r in examples(F.col("x.overlap"), n_ex):
                x, pm = r["x"], r["x"]["pm"]
                ov_ex.append({"source": self.sources[r["src"]],
                              "block": self._describe(r["kind"], x["start"], x["end"], r["broker_id"],
                                                      r["broker_epoch"], x["ref"], x["pos"]),
                              "overlaps": self._partner(pm),
                              "shared_ids": min(x["end"], pm["end"]) - x["start"],
                              "copies": r["n"]})
            self._resolve_carried(ov_ex)
            self._enrich_chaos(ov_ex)
        gap_ex = []
        if gaps:
            for r in examples(F.col("x.gap").isNotNull(), n_ex):
                x, pm = r["x"], r["x"]["pm"]
                gap_ex.append({"source": self.sources[r["src"]], "from": pm["end"], "to": x["start"],
                               "wasted_ids": x["gap"],
                               "after": self._partner(pm),
                               "before": self._describe(r["kind"], x["start"], x["end"], r["broker_id"],
                                                        r["broker_epoch"], x["ref"], x["pos"])})
            self._resolve_carried(gap_ex)
            self._enrich_chaos(gap_ex)
        dis_ex = []
        if disagree:
            for r in examples(F.col("status") == DISAGREE, n_ex):
                x = r["x"]
                dis_ex.append({"source": self.sources[r["src"]], "raft_index": x["ref"], "position": x["pos"],
                               "block": self._describe(r["kind"], x["start"], x["end"], r["broker_id"],
                                                       r["broker_epoch"], x["ref"], x["pos"])})
            self._disagreement_nodes(dis_ex)
        return {"blocks": {"issued": issued, "ids_issued": ids, "by_kind": by_kind, "refused_records": refused,
                           "chaos_acks_matched": acks},
                "checks": {"overlaps": {"count": overlaps, "ids_reissued": reissued, "examples": ov_ex},
                           "node_disagreements": {"count": disagree, "examples": dis_ex}},
                "gaps": {"count": gaps, "wasted_ids": wasted, "examples": gap_ex},
                "id_space": id_space}

    def _partner(self, pm) -> dict:
        if -pm["nkind"] == CARRIED:
            return {"kind": "carried", "end": pm["end"]}
        return self._describe(-pm["nkind"], pm["start"], pm["end"], pm["broker_id"], pm["broker_epoch"], pm["ref"],
                              pm["pos"])

    def _resolve_carried(self, examples: list[dict]) -> None:
        """Name the blocks examples know only by their end (carried in from an earlier bucket): the
        accepted block of that source with that end (lowest kind, then Raft index, if several)."""
        from pyspark.sql import functions as F

        want = {(e["source"], b["end"]) for e in examples for b in e.values()
                if isinstance(b, dict) and b.get("kind") == "carried"}
        if not want:
            return
        cond = None
        for src, end in want:
            c = (F.col("source") == src) & (F.col("end") == end)
            cond = c if cond is None else cond | c
        found: dict[tuple[str, int], dict] = {}
        for r in (self._blocks().filter(F.col("accepted") & cond)
                  .groupBy("source", "end").agg(F.min(F.struct("kind", "ref", "pos", "start", "broker_id",
                                                                 "broker_epoch")).alias("b")).collect()):
            b = r["b"]
            found[(r["source"], r["end"])] = self._describe(b["kind"], b["start"], r["end"], b["broker_id"],
                                                            b["broker_epoch"], b["ref"], b["pos"])
        for e in examples:
            for k, b in list(e.items()):
                if isinstance(b, dict) and b.get("kind") == "carried":
                    e[k] = found.get((e["source"], b["end"]), {"kind": "unknown", "end": b["end"]})

    def _enrich_chaos(self, examples: list[dict]) -> None:
        """Add process names to chaos blocks named in examples (a filter on the few op indexes)."""
        from pyspark.sql import functions as F

        want = {(e["source"], b["op_index"]) for e in examples for b in e.values()
                if isinstance(b, dict) and b.get("kind") == "chaos"}
        if not want:
            return
        c = self.df["chaos_allocate"]
        rows = (c.filter(F.col("index").cast("bigint").isin(sorted({i for _, i in want})))
                .select("source", F.col("index").cast("bigint").alias("index"), "process").collect())
        names = {(r["source"], r["index"]): r["process"] for r in rows}
        for e in examples:
            for b in e.values():
                if isinstance(b, dict) and b.get("kind") == "chaos":
                    b["process"] = names.get((e["source"], b["op_index"]))

    def _disagreement_nodes(self, examples: list[dict]) -> None:
        from pyspark.sql import functions as F

        a = self.df["alloc"]
        keys = sorted({e["raft_index"] for e in examples})
        rows = (a.filter(F.col("raft_index").isin(keys))
                .select("source", "raft_index", "position", "node_id", "accepted", "error").collect())
        for e in examples:
            e["nodes"] = sorted(({"node_id": r["node_id"], "accepted": r["accepted"], "error": r["error"]}
                                 for r in rows if (r["source"], r["raft_index"], r["position"])
                                 == (e["source"], e["raft_index"], e["position"])), key=lambda d: d["node_id"])

    # ------------------------------------------------------------ migration boundary
    def _boundary(self) -> dict:
        from pyspark.sql import functions as F

        if not self.t["seed"].rows:
            return {"count": 0, "seeds": 0, "examples": [], "checked": []}
        seeds = (self.df["seed"].filter("accepted")
                 .select("source", "raft_index", "position", "next_producer_id", "origin", "zk_broker",
                         "zk_block_start", "zk_block_end", "timestamp_ms")
                 .dropDuplicates(["source", "raft_index", "position"]).collect())
        if not seeds:
            return {"count": 0, "seeds": 0, "examples": [], "checked": []}
        sdf = self.spark.createDataFrame(
            [(i, s["source"], s["raft_index"], s["position"]) for i, s in enumerate(seeds)],
            "seed int, s_source string, s_ref bigint, s_pos int")
        a = self.df["alloc"].filter("accepted")
        j = a.join(F.broadcast(sdf), (a["source"] == sdf["s_source"]) & (
            (a["raft_index"] > sdf["s_ref"]) | ((a["raft_index"] == sdf["s_ref"]) & (a["position"] > sdf["s_pos"]))))
        first = {r["seed"]: r["f"] for r in j.groupBy("seed").agg(F.min(F.struct(
            "raft_index", "position", "producer_id_start", "producer_id_len", "broker_id", "broker_epoch",
            "timestamp_ms")).alias("f")).collect()}
        checked, bad = [], []
        for i, s in enumerate(seeds):
            f = first.get(i)
            e: dict[str, Any] = {"source": s["source"], "seed_raft_index": s["raft_index"],
                                 "origin": s["origin"], "zk_broker": s["zk_broker"],
                                 "zk_block_start": s["zk_block_start"], "zk_block_end": s["zk_block_end"],
                                 "next_producer_id": s["next_producer_id"]}
            if f is None:
                e["first_block"] = None
                e["ok"] = True
                e["note"] = "no quorum block after this seed"
            else:
                e["first_block"] = self._describe(QUORUM, f["producer_id_start"],
                                                  f["producer_id_start"] + f["producer_id_len"], f["broker_id"],
                                                  f["broker_epoch"], f["raft_index"], f["position"])
                e["ok"] = f["producer_id_start"] > s["zk_block_end"]
                if not e["ok"]:
                    e["note"] = (f"first quorum block after the seed starts at {f['producer_id_start']}, inside or "
                                 f"below the ZooKeeper block ending at {s['zk_block_end']}")
                    bad.append(e)
            checked.append(e)
        bad.sort(key=lambda e: (e["source"], e["seed_raft_index"]))
        return {"count": len(bad), "seeds": len(seeds), "examples": bad[:self.o.examples],
                "checked": checked[:self.o.examples]}

    # ------------------------------------------------------------ chaos PIDs
    def _duplicate_pids(self) -> dict:
        from pyspark.sql import functions as F

        t = self.t["chaos_generate"]
        if not t.rows:
            return {"count": 0, "pids_checked": 0, "extra_issues": 0, "examples": []}
        g = self.df["chaos_generate"].select("source", F.col("pid").cast("bigint").alias("pid"),
                                             F.struct(F.col("index").cast("bigint").alias("index"), "process")
                                             .alias("op"))
        d = (g.groupBy("source", "pid").agg(F.count(F.lit(1)).alias("n"), F.min("op").alias("first"),
                                            F.max("op").alias("last"))
             .filter("n > 1").persist())
        try:
            s = d.agg(F.count(F.lit(1)).alias("c"), F.sum(F.col("n") - 1).alias("extra")).collect()[0]
            ex = d.orderBy("source", "pid").limit(self.o.examples).collect() if s["c"] else []
        finally:
            d.unpersist()
        return {"count": s["c"], "pids_checked": t.rows, "extra_issues": int(s["extra"] or 0),
                "examples": [{"source": r["source"], "pid": r["pid"], "times": r["n"],
                              "first": {"op_index": r["first"]["index"], "process": r["first"]["process"]},
                              "last": {"op_index": r["last"]["index"], "process": r["last"]["process"]}}
                             for r in ex]}

    # ------------------------------------------------------------ brokers
    def _brokers(self, R) -> tuple[dict, dict, dict]:
        from pyspark.sql import functions as F

        o = self.o
        out: dict[str, Any] = {"window_ms": o.window_ms,
                               "thresholds": {"registrations_per_window": o.restart_registrations,
                                              "epochs_per_window": o.restart_epochs,
                                              "rate_factor_over_fleet_median": o.rate_factor,
                                              "rate_min_blocks": o.rate_min_blocks},
                               "count": 0, "per_broker": [], "restart_loops": {"count": 0, "examples": []}}
        per: dict[tuple[str, int], dict] = {}
        projections: dict[str, dict] = {}
        rq = None
        if R is not None:
            rq = (R.filter((F.col("kind") == QUORUM) & (F.col("status") == ISSUED) & F.col("win").isNotNull())
                  .groupBy("src", "broker_id", "win")
                  .agg(F.sum("n").alias("blocks"), F.sum(F.col("ids").cast("decimal(38,0)")).alias("ids"),
                       F.countDistinct("broker_epoch").alias("epochs"))
                  .persist())
            span = {r["src"]: r for r in rq.groupBy("src").agg(
                F.percentile_approx("blocks", 0.5).alias("median"), F.min("win").alias("w0"),
                F.max("win").alias("w1"), F.sum("ids").alias("ids")).collect()}
            for r in (rq.groupBy("src", "broker_id")
                      .agg(F.sum("blocks").alias("blocks"), F.sum("ids").alias("ids"),
                           F.count(F.lit(1)).alias("windows"),
                           F.percentile_approx("blocks", 0.5).alias("median"),
                           F.max(F.struct("blocks", "win")).alias("peak"),
                           F.max(F.struct("epochs", "win")).alias("peak_epochs"),
                           F.min("win").alias("w0"), F.max("win").alias("w1"))
                      .collect()):
                src = self.sources[r["src"]]
                fm = span[r["src"]]["median"] or 0
                reasons = []
                peak = r["peak"]["blocks"]
                if peak >= o.rate_min_blocks and peak >= o.rate_factor * max(fm, 1):
                    reasons.append(f"{peak} blocks in one window ({peak / max(fm, 1):.0f}x the fleet median {fm})")
                if r["peak_epochs"]["epochs"] >= o.restart_epochs:
                    reasons.append(f"{r['peak_epochs']['epochs']} broker epochs in one window")
                per[(src, r["broker_id"])] = {
                    "source": src, "broker_id": r["broker_id"], "blocks": r["blocks"], "ids": int(r["ids"]),
                    "windows": r["windows"], "median_blocks_per_window": r["median"],
                    "fleet_median_blocks_per_window": fm,
                    "peak_blocks_per_window": peak, "peak_window_start_ms": r["peak"]["win"] * o.window_ms,
                    "max_epochs_per_window": r["peak_epochs"]["epochs"],
                    "first_window_ms": r["w0"] * o.window_ms, "last_window_end_ms": (r["w1"] + 1) * o.window_ms,
                    "registrations": 0, "max_registrations_per_window": 0, "reasons": reasons}
            projections = self._projections(rq, span)
        if self.t["register"].rows:
            reg = (self.df["register"].filter("accepted").dropDuplicates(["source", "raft_index", "position"])
                   .select("source", "broker_id", "broker_epoch",
                           F.when(F.col("timestamp_ms") >= 0, F.expr(f"timestamp_ms DIV {o.window_ms}L")).alias("win"))
                   .groupBy("source", "broker_id", "win").agg(F.count(F.lit(1)).alias("n"))
                   .groupBy("source", "broker_id")
                   .agg(F.sum("n").alias("total"),
                        F.max(F.when(F.col("win").isNotNull(), F.struct("n", "win"))).alias("peak"))
                   .collect())
            for r in reg:
                if r["source"] not in self.sources:
                    self.sources.append(r["source"])
                b = per.setdefault((r["source"], r["broker_id"]), {
                    "source": r["source"], "broker_id": r["broker_id"], "blocks": 0, "ids": 0, "windows": 0,
                    "median_blocks_per_window": None, "fleet_median_blocks_per_window": None,
                    "peak_blocks_per_window": 0, "peak_window_start_ms": None, "max_epochs_per_window": 0,
                    "first_window_ms": None, "last_window_end_ms": None, "reasons": []})
                b["registrations"] = r["total"]
                pk = r["peak"]
                b["max_registrations_per_window"] = pk["n"] if pk else 0
                if pk and pk["n"] >= o.restart_registrations:
                    at = datetime.datetime.fromtimestamp(pk["win"] * o.window_ms / 1000, datetime.timezone.utc)
                    b["reasons"].insert(0, f"{pk['n']} registrations in one window "
                                           f"(from {at.isoformat(timespec='seconds')})")
        brokers = sorted(per.values(), key=lambda b: (not b["reasons"], -b["ids"], b["source"], b["broker_id"]))
        loops = [b for b in brokers if b["reasons"]]
        out["count"] = len(brokers)
        out["per_broker"] = brokers
        out["restart_loops"] = {"count": len(loops), "examples": [
            {"source": b["source"], "broker_id": b["broker_id"], "reasons": b["reasons"]} for b in loops[:o.examples]]}
        series = self._series(rq, brokers) if rq is not None else {}
        if rq is not None:
            rq.unpersist()
        return out, series, projections

    def _projections(self, rq, span: dict) -> dict:
        """Observed rate per source: IDs of timed quorum blocks per second over the last 24 h of windows
        that saw allocations (all of them if the history is shorter); ``finish_projection`` turns it into
        when the ID space runs out."""
        from pyspark.sql import functions as F

        o = self.o
        if not span:  # no timed quorum block (e.g. only chaos histories): no rate
            return {}
        day = max(1, 86_400_000 // o.window_ms)
        cond = None
        for k, v in span.items():
            c = (F.col("src") == k) & (F.col("win") > v["w1"] - day)
            cond = c if cond is None else cond | c
        recent = {r["src"]: r for r in rq.filter(cond).groupBy("src").agg(
            F.min("win").alias("w0"), F.sum("ids").alias("ids")).collect()}
        out = {}
        for k, v in span.items():
            r = recent[k]
            from_ms, to_ms = r["w0"] * o.window_ms, (v["w1"] + 1) * o.window_ms
            out[self.sources[k]] = {
                "timed_ids": int(v["ids"]), "timed_from_ms": v["w0"] * o.window_ms, "timed_to_ms": to_ms,
                "rate_from_ms": from_ms, "rate_ids": int(r["ids"]),
                "rate_ids_per_s": int(r["ids"]) / ((to_ms - from_ms) / 1000.0)}
        return out

    def _series(self, rq, brokers: list[dict]) -> dict:
        """Blocks per window for the brokers worth drawing (restart-loop suspects first, then the largest)."""
        from pyspark.sql import functions as F

        pick: dict[str, list[int]] = {}
        for b in brokers:
            if b["windows"] and len(pick.setdefault(b["source"], [])) < CHART_BROKERS:
                pick[b["source"]].append(b["broker_id"])
        if not pick:
            return {}
        idx = {s: i for i, s in enumerate(self.sources)}
        cond = None
        for src, ids in pick.items():
            c = (F.col("src") == idx[src]) & F.col("broker_id").isin(ids)
            cond = c if cond is None else cond | c
        out: dict[str, dict[int, list[tuple[int, int]]]] = {}
        for r in rq.filter(cond).select("src", "broker_id", "win", "blocks").collect():
            out.setdefault(self.sources[r["src"]], {}).setdefault(r["broker_id"], []).append((r["win"], r["blocks"]))
        flagged = {(b["source"], b["broker_id"]) for b in brokers if b["reasons"]}
        return {src: {"brokers": {str(b): sorted(v) for b, v in d.items()},
                      "flagged": [b for b in d if (src, b) in flagged]} for src, d in out.items()}


def finish_projection(report: dict) -> None:
    """Years and date when each ID space runs out at its observed rate (fills ``id_space``)."""
    for src, s in report.get("id_space", {}).items():
        nxt = s.get("next_id")
        if nxt is None:
            continue
        s["remaining_ids"] = max(0, ID_MAX + 1 - nxt)
        s["used_fraction"] = nxt / (ID_MAX + 1)
        rate = s.get("rate_ids_per_s")
        s["exhausted_in_years"] = None
        s["exhausted_at"] = None
        if rate:
            secs = s["remaining_ids"] / rate
            s["exhausted_in_years"] = secs / (365.25 * 86400)
            last = s.get("timed_to_ms")
            if last is not None and secs < 7000 * 365.25 * 86400:
                at = datetime.datetime.fromtimestamp(last / 1000, datetime.timezone.utc) + datetime.timedelta(seconds=secs)
                s["exhausted_at"] = at.isoformat(timespec="seconds")


# --------------------------------------------------------------------------
# spark-submit entry point
# --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="audit/job.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="directory written by pidctl audit export")
    p.add_argument("--out", help="write audit.json and charts here")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")
    p.add_argument("--examples", type=int, default=EXAMPLES)
    p.add_argument("--window-ms", type=int, default=WINDOW_MS)
    p.add_argument("--per-source", action="store_true", help="one ID space per exported source")
    a = p.parse_args(argv)
    from .spark import SparkSetupError, spark_session

    try:
        # Under spark-submit the master comes from it; run directly, the default is local[*].
        master = a.master or (None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*]")
        spark = spark_session(master)
        report = run_audit(a.input, out_dir=a.out, spark=spark, examples=a.examples, window_ms=a.window_ms,
                           id_spaces="source" if a.per_source else "cluster")
    except (AuditInputError, SparkSetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        from .report import render_summary
        render_summary(report)
    return EXIT_OK if report["valid"] else EXIT_VIOLATIONS


if __name__ == "__main__":
    if __package__ in (None, ""):
        import importlib
        sys.exit(importlib.import_module("audit.job").main())
    sys.exit(main())
