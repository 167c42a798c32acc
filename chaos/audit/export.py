"""Audit trails and chaos histories as typed Parquet: the input of the Spark audit job.

``export(src, dest)`` (``pidctl audit export --from SRC --to DEST``) reads local clusters, node data
directories and chaos runs under ``SRC`` and writes one Parquet table per record type, one for audit
gaps and one per chaos operation, with ``manifest.json`` written last.  The sources it reads, the
layout it writes, its errors and how it stays atomic are in docs/simulation.md, section 13, "The export".
"""
from __future__ import annotations

import json
import os
import re
import shutil
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from chaos.history import (
    ALLOCATE,
    GENERATE,
    NEMESIS_PREFIX,
    OK,
    iter_history,
    owner,
)
from chaos.audit.schemas import (
    AUDIT_ENTRY_FIELDS,
    CHAOS_ALLOCATE_SCHEMA,
    CHAOS_ALLOCATE_TABLE,
    CHAOS_GENERATE_SCHEMA,
    CHAOS_GENERATE_TABLE,
    FIELD_TYPES,  # noqa: F401 (re-exported: chaos.audit.export.FIELD_TYPES, as before the schemas moved)
    GAP_SCHEMA,
    GAPS_TABLE,
    OP_COLUMNS,
    arrow_schema,
    record_table,
    schema_to_json,
)
from chaos.runner import HISTORY
from quorum.localcluster import pid_exists
from quorum.trail import read_audit
from records import AuditEntry, AuditGap
from records.schema import RECORDS, RecordSpec
from snapshots.storage.disk import CorruptFileError
from snapshots.storage.files import atomic_write, fsync_dir

FORMAT = 1
MANIFEST = "manifest.json"
AUDIT_FILE = "audit.log"
CLUSTER_SUBDIR = "cluster"  # where a chaos run keeps its nodes (chaos.runner)

OUTPUT_NAMES = ("records", "gaps", "chaos", MANIFEST)  # the top-level entries an export owns in DEST

ROW_GROUP_ROWS = 256 * 1024
UNKNOWN_NODE = -1

KINDS = ("cluster", "node", "chaos")
REPLICATED: dict[str, RecordSpec] = {s.name: s for s in RECORDS}


class ExportError(Exception):
    """An audit export cannot be made (or read): bad source or destination, nothing found, no manifest."""


# --------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------

_NODE_DIR = re.compile(r"node-(\d+)\Z")


@dataclass
class Source:
    name: str
    kind: str                                   # cluster | node | chaos
    path: str                                   # absolute
    audits: list[tuple[int, str]] = field(default_factory=list)  # (node_id, audit.log path), by node id
    history: str | None = None
    slug: str = ""


def _node_audits(d: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ExportError(f"{d}: cannot read: {e.strerror or e}") from None
    out = []
    for name in names:
        m = _NODE_DIR.match(name)
        audit = os.path.join(d, name, AUDIT_FILE)
        if m and os.path.lexists(audit) and not os.path.isdir(audit):
            out.append((int(m.group(1)), audit))
    return sorted(out)


def _classify(d: str) -> Source | None:
    """What directory ``d`` is: a chaos run, a local cluster, a node's data dir, or none of them."""
    if os.path.lexists(os.path.join(d, HISTORY)):
        return Source("", "chaos", d, _node_audits(os.path.join(d, CLUSTER_SUBDIR)), os.path.join(d, HISTORY))
    audits = _node_audits(d)
    if audits:
        return Source("", "cluster", d, audits)
    audit = os.path.join(d, AUDIT_FILE)
    if os.path.lexists(audit) and not os.path.isdir(audit):
        m = _NODE_DIR.match(os.path.basename(d))
        return Source("", "node", d, [(int(m.group(1)) if m else UNKNOWN_NODE, audit)])
    return None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace(os.sep, "__")).lstrip("._") or "source"


def find_sources(src: str, skip: tuple[str, ...] = ()) -> list[Source]:
    """Every source under ``src`` (``src`` itself if it is one), named and slugged.

    ``skip``: real paths not to look into (the export's own directory).
    """
    root = os.path.abspath(src)
    if not os.path.exists(root):
        raise ExportError(f"{src}: no such file or directory")
    if not os.path.isdir(root):
        raise ExportError(f"{src}: not a directory (give a local cluster, a node data directory, a chaos run "
                          "directory, or a directory holding them)")
    try:
        if not os.listdir(root):
            raise ExportError(f"{src}: empty directory: nothing to export")
    except OSError as e:
        raise ExportError(f"{src}: cannot read: {e.strerror or e}") from None
    found: list[Source] = []
    top = _classify(root)
    if top is not None:
        top.name = os.path.basename(root) or "source"
        found.append(top)
    else:
        def fail(e: OSError):
            raise ExportError(f"{e.filename}: cannot read: {e.strerror or e}")

        for d, dirnames, _ in os.walk(root, onerror=fail):
            keep = []
            for name in sorted(dirnames):
                full = os.path.join(d, name)
                if name.startswith(".") or os.path.realpath(full) in skip:
                    continue
                s = _classify(full)
                if s is None:
                    keep.append(name)
                else:
                    s.name = os.path.relpath(full, root)
                    found.append(s)
            dirnames[:] = keep
    used: set[str] = set()
    for s in found:
        base = slug = _slug(s.name)
        n = 2
        while slug in used:
            slug, n = f"{base}-{n}", n + 1
        used.add(slug)
        s.slug = slug
    return found


# --------------------------------------------------------------------------
# Writing tables
# --------------------------------------------------------------------------

def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Out:
    """The files of one export under construction (paths relative to ``root``)."""

    def __init__(self, root: str, row_group_rows: int):
        self.root = root
        self.row_group_rows = row_group_rows
        self.tables: dict[str, dict] = {}
        self.dirs: set[str] = set()

    def path(self, rel: str) -> str:
        full = os.path.join(self.root, *rel.split("/"))
        d = os.path.dirname(full)
        if d not in self.dirs:
            os.makedirs(d, exist_ok=True)
            self.dirs.add(d)
        return full

    def done(self, rel: str, schema: pa.Schema, rows: int) -> None:
        _fsync_file(os.path.join(self.root, *rel.split("/")))
        self.tables[rel] = {"rows": rows, "schema": schema_to_json(schema)}

    def write(self, rel: str, table: pa.Table) -> None:
        pq.write_table(table, self.path(rel), row_group_size=self.row_group_rows)
        self.done(rel, table.schema, table.num_rows)

    def sync_dirs(self) -> None:
        for d in sorted(self.dirs, key=len, reverse=True):
            fsync_dir(d)
        fsync_dir(self.root)


def _ints(values: array, typ: pa.DataType) -> pa.Array:
    """An Arrow array over an array.array's buffer (no per-value conversion)."""
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


_TYPECODES = {pa.int8(): "b", pa.int16(): "h", pa.int32(): "i", pa.int64(): "q"}
assert array("i").itemsize == 4 and array("q").itemsize == 8


class _OpTable:
    """One chaos table of one source, written in row groups while the history streams by."""

    def __init__(self, out: _Out, rel: str, schema: pa.Schema, source: str):
        self.out, self.rel, self.schema, self.source = out, rel, schema, source
        self.value_names = [f.name for f in schema][len(OP_COLUMNS):]
        self.value_types = [schema.field(n).type for n in self.value_names]
        self.process_ids: dict[str, int] = {}
        self.processes: list[str] = []
        self.rows = 0
        self.writer: pq.ParquetWriter | None = None
        self._reset()

    def _reset(self) -> None:
        self.proc = array("i")
        self.index = array("q")
        self.time = array("q")
        self.values = [array(_TYPECODES[t]) for t in self.value_types]

    def process_id(self, process: str) -> int:
        pid = self.process_ids.get(process)
        if pid is None:
            pid = self.process_ids[process] = len(self.processes)
            self.processes.append(process)
        return pid

    def flush(self) -> None:
        n = len(self.index)
        if n == 0:
            return
        ids = _ints(self.proc, pa.int32())
        names = pa.array(self.processes, pa.string())
        owners = pa.array([owner(p) for p in self.processes], pa.string())
        arrays = [pa.repeat(pa.scalar(self.source, pa.string()), n), names.take(ids), owners.take(ids),
                  _ints(self.index, pa.int64()), _ints(self.time, pa.int64())]
        arrays += [_ints(v, t) for v, t in zip(self.values, self.value_types)]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.out.path(self.rel), self.schema)
        self.writer.write_table(table, row_group_size=self.out.row_group_rows)
        self.rows += n
        self._reset()

    def close(self) -> int:
        self.flush()
        if self.writer is None:
            pq.write_table(self.schema.empty_table(), self.out.path(self.rel))
        else:
            self.writer.close()
        self.out.done(self.rel, self.schema, self.rows)
        return self.rows

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()


# --------------------------------------------------------------------------
# Reading sources
# --------------------------------------------------------------------------

def _export_audits(src: Source, out: _Out, counts: dict) -> None:
    """Every node's audit lines of ``src``: one table per record type, one for gaps."""
    columns: dict[str, dict[str, list]] = {}
    gaps: dict[str, list] = {"node_id": [], "raft_index": []}
    per_type: dict[str, int] = {}
    lines_total = refused = torn = 0
    for node_id, path in src.audits:
        try:
            lines, valid = read_audit(path)
            size = os.path.getsize(path)
        except OSError as e:
            raise ExportError(f"{path}: cannot read: {e.strerror or e}") from None
        torn += size - valid
        lines_total += len(lines)
        for ln in lines:
            entry, rec = ln.entry, ln.record
            if isinstance(entry, AuditGap):
                if rec is not None:
                    raise CorruptFileError(path, f"gap line at raft index {entry.raft_index} carries a record")
                gaps["node_id"].append(node_id)
                gaps["raft_index"].append(entry.raft_index)
                continue
            if not isinstance(entry, AuditEntry):
                raise CorruptFileError(path, f"audit line starts with a {entry.SPEC.name}, not an AuditEntry")
            where = f"audit line at raft index {entry.raft_index} position {entry.position}"
            if rec is None:
                raise CorruptFileError(path, f"{where} has no record")
            name = rec.SPEC.name
            if name != entry.record:
                raise CorruptFileError(path, f"{where} says {entry.record} but holds a {name}")
            if name not in REPLICATED:
                raise CorruptFileError(path, f"{where} holds a {name}, which is not a replicated record")
            cols = columns.get(name)
            if cols is None:
                cols = columns[name] = {f.name: [] for f in arrow_schema(rec.SPEC)}
                cols["source"] = None  # constant, built at the end
            cols["node_id"].append(node_id)
            for k in AUDIT_ENTRY_FIELDS:
                cols[k].append(getattr(entry, k))
            for f in rec.SPEC.fields:
                cols[f.name].append(getattr(rec, f.name))
            per_type[name] = per_type.get(name, 0) + 1
            if not entry.accepted:
                refused += 1
    for name in sorted(columns):
        schema = arrow_schema(REPLICATED[name])
        out.write(f"{record_table(name)}/part-{src.slug}.parquet", _table(schema, columns[name], src.name))
    if gaps["raft_index"]:
        out.write(f"{GAPS_TABLE}/part-{src.slug}.parquet", _table(GAP_SCHEMA, gaps, src.name))
    counts.update({"nodes": len(src.audits), "audit_lines": lines_total, "gaps": len(gaps["raft_index"]),
                   "refused": refused, "torn_tail_bytes": torn, "records": dict(sorted(per_type.items()))})


def _table(schema: pa.Schema, cols: dict[str, list], source: str) -> pa.Table:
    n = len(cols["node_id"])
    arrays = [pa.repeat(pa.scalar(source, pa.string()), n) if f.name == "source" else pa.array(cols[f.name], f.type)
              for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _export_history(src: Source, out: _Out, counts: dict, allow_torn_tail: bool = False) -> None:
    """Stream ``src.history`` into the chaos tables (chaos.history.iter_history: read_history's checks).

    read_history would hold every Op (~380 bytes each: ~1 GB for 2.7 M ops); this keeps
    only the open invokes and one row group of columns.
    """
    path = src.history
    alloc = _OpTable(out, f"{CHAOS_ALLOCATE_TABLE}/part-{src.slug}.parquet", CHAOS_ALLOCATE_SCHEMA, src.name)
    gen = _OpTable(out, f"{CHAOS_GENERATE_TABLE}/part-{src.slug}.parquet", CHAOS_GENERATE_SCHEMA, src.name)
    rg = out.row_group_rows
    g_proc, g_index, g_time, (g_pid,) = gen.proc, gen.index, gen.time, gen.values
    g_ids = gen.process_ids  # process -> id; a nemesis process never gets one
    alloc_keys = alloc.value_names
    n_ops = n_alloc = n_gen = 0
    warnings: list[str] = []
    try:
        for n_ops, op in enumerate(iter_history(path, allow_torn_tail=allow_torn_tail, warnings=warnings), 1):
            # --- the rows -----------------------------------------------------------
            if op.type != OK:
                continue
            process = op.process
            if op.f == GENERATE:
                proc_id = g_ids.get(process)
                if proc_id is None:
                    if process.startswith(NEMESIS_PREFIX):
                        continue
                    proc_id = gen.process_id(process)
                g_proc.append(proc_id)
                g_index.append(op.index)
                g_time.append(op.time_ns)
                g_pid.append(op.value)
                n_gen += 1
                if len(g_index) >= rg:
                    gen.flush()
                    g_proc, g_index, g_time, (g_pid,) = gen.proc, gen.index, gen.time, gen.values
            elif op.f == ALLOCATE and not process.startswith(NEMESIS_PREFIX):
                alloc.proc.append(alloc.process_id(process))
                alloc.index.append(op.index)
                alloc.time.append(op.time_ns)
                v = op.value
                for col, k in zip(alloc.values, alloc_keys):
                    col.append(v[k])
                n_alloc += 1
                if len(alloc.index) >= rg:
                    alloc.flush()
        if warnings:
            counts["torn_tail_lines"] = 1
        alloc.close()
        gen.close()
    except BaseException:
        alloc.abort()
        gen.abort()
        raise
    counts.update({"history_ops": n_ops, "allocate_ok": n_alloc, "generate_ok": n_gen})


# --------------------------------------------------------------------------
# The export
# --------------------------------------------------------------------------

def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def _prepare_dest(dest: str, src_real: str, force: bool) -> bool:
    """Check ``dest``; return whether it had to be created."""
    if os.path.lexists(dest) and not os.path.isdir(dest):
        raise ExportError(f"{dest}: exists and is not a directory")
    dest_real = os.path.realpath(dest)
    if src_real == dest_real or any(_inside(src_real, os.path.join(dest_real, n)) for n in OUTPUT_NAMES):
        raise ExportError(f"{dest}: the export would overwrite its own input {src_real}")
    if os.path.isdir(dest):
        try:
            entries = os.listdir(dest)
        except OSError as e:
            raise ExportError(f"{dest}: cannot read: {e.strerror or e}") from None
        if entries and not force:
            raise ExportError(f"{dest}: not empty ({len(entries)} entries); give an empty directory, or --force "
                              "to replace a previous export there")
        return False
    try:
        os.makedirs(dest)
    except OSError as e:
        raise ExportError(f"{dest}: cannot create: {e.strerror or e}") from None
    return True


def _publish(tmp: str, dest: str, manifest: dict) -> None:
    """Replace the previous export in ``dest`` (if any) by the one in ``tmp``; the manifest goes last."""
    old_manifest = os.path.join(dest, MANIFEST)
    if os.path.lexists(old_manifest):
        os.remove(old_manifest)  # from here on, dest does not look finished
        fsync_dir(dest)
    trash = os.path.join(tmp, ".old")
    for name in OUTPUT_NAMES:
        old = os.path.join(dest, name)
        if os.path.lexists(old):
            os.makedirs(trash, exist_ok=True)
            os.replace(old, os.path.join(trash, name))
    for name in OUTPUT_NAMES:
        new = os.path.join(tmp, name)
        if name != MANIFEST and os.path.exists(new):
            os.replace(new, os.path.join(dest, name))
    fsync_dir(dest)
    atomic_write(old_manifest, (json.dumps(manifest, indent=1) + "\n").encode())


def export(src: str, dest: str, *, force: bool = False, row_group_rows: int = ROW_GROUP_ROWS,
           allow_torn_tail: bool = False, progress: Callable[[str], None] | None = None) -> dict:
    """Export every source under ``src`` to ``dest`` (see the module doc); returns the manifest.

    ``force``: ``dest`` may be non-empty; a previous export there is replaced (other entries
    are left alone).  ``allow_torn_tail``: a torn last history line is dropped instead of refused.
    """
    if row_group_rows < 1:
        raise ValueError("row_group_rows must be >= 1")
    src_real = os.path.realpath(src)
    dest_abs = os.path.abspath(dest)
    sources = find_sources(src, skip=(os.path.realpath(dest_abs),))
    if not sources:
        raise ExportError(f"{src}: no audit trail or chaos history found (looked for node-N/{AUDIT_FILE}, "
                          f"{AUDIT_FILE} and {HISTORY} at any depth)")
    created = _prepare_dest(dest_abs, src_real, force)
    if force:  # leftovers of exports that died (never one still running)
        for name in os.listdir(dest_abs):
            m = re.fullmatch(r"\.tmp-(\d+)", name)
            if m and not pid_exists(int(m.group(1))):
                shutil.rmtree(os.path.join(dest_abs, name), ignore_errors=True)
    tmp = os.path.join(dest_abs, f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        out = _Out(tmp, row_group_rows)
        described = []
        for s in sources:
            if progress:
                progress(f"{s.kind} {s.name}")
            counts: dict[str, Any] = {}
            try:
                _export_audits(s, out, counts)
                if s.history is not None:
                    _export_history(s, out, counts, allow_torn_tail)
            except OSError as e:
                if e.filename and _inside(os.path.abspath(e.filename), tmp):
                    raise ExportError(f"{dest}: cannot write {e.filename}: {e.strerror or e}") from None
                raise ExportError(f"{e.filename or s.path}: cannot read: {e.strerror or e}") from None
            described.append({"name": s.name, "kind": s.kind, "path": s.path, "slug": s.slug, "counts": counts})
        out.sync_dirs()
        manifest = {"format": FORMAT, "sources": described, "tables": dict(sorted(out.tables.items())),
                    "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")}
        try:
            _publish(tmp, dest_abs, manifest)
        except OSError as e:
            raise ExportError(f"{dest}: cannot write: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            try:
                os.rmdir(dest_abs)
            except OSError:
                pass
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return manifest
