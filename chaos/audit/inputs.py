"""The audit job's input: a directory written by ``pidctl audit export``, read and checked on the driver.

``TABLES`` describes each of the export's tables once: its directory, its columns
with the Arrow types accepted, and the rules its values obey.  ``load_manifest``
and ``scan_table`` check the manifest, every Parquet file's schema, its values
(footer min/max statistics first; the rows of a row group are read only when its
statistics cannot clear it) and its row count against the manifest, and raise
``AuditInputError`` naming the file and column, before Spark starts.  A table's
footers also give the (min start, max start, rows) pieces the ID-space buckets
are planned from (``chaos.audit.buckets``).  ``Table.dataframe`` reads a checked table
on Spark.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from records.schema import BY_NAME, LONG_MAX

FORMAT = 1


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

    def dataframe(self, spark):
        """The table on Spark, with the column types its files were checked to have (empty if no files)."""
        if not self.files:
            return spark.createDataFrame([], self.spark_schema())
        return spark.read.schema(self.spark_schema()).parquet(*self.files)


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
    import pyarrow as pa  # heavy (pyarrow): imported when used

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
    import numpy as np  # heavy (numpy), and only for a row group that breaks a rule: imported when used

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
    import pyarrow.parquet as pq  # heavy (pyarrow): imported when used

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
