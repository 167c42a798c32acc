"""The Parquet schemas of an audit export, derived from the single descriptions of the data:
``records.schema`` for the audit trail (``FIELD_TYPES`` maps its types to Arrow's) and
``chaos.history.VALUE_SHAPES`` for the values of ok chaos operations; and where each table lives."""
from __future__ import annotations

import pyarrow as pa

from chaos.history import ALLOCATE, GENERATE, OK, VALUE_SHAPES
from records.schema import AUDIT_ENTRY, AUDIT_GAP, INT_RANGES, FieldSpec, RecordSpec

RECORDS_DIR = "records"
GAPS_TABLE = "gaps"
CHAOS_ALLOCATE_TABLE = "chaos/allocate"
CHAOS_GENERATE_TABLE = "chaos/generate"

FIELD_TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "nullable_string": pa.string(),
    "float64": pa.float64(),
}


def arrow_field(f: FieldSpec) -> pa.Field:
    """The Arrow field of a record field: the one mapping from ``records.schema`` types to Arrow."""
    try:
        typ = FIELD_TYPES[f.type]
    except KeyError:
        raise ValueError(f"field {f.name}: no Arrow type for {f.type!r}") from None
    return pa.field(f.name, typ, nullable=f.type == "nullable_string")


SOURCE_FIELD = pa.field("source", pa.string(), nullable=False)
NODE_ID_FIELD = pa.field("node_id", pa.int32(), nullable=False)

# source, node_id, then AuditEntry's fields except ``record`` (the record type is the table):
# raft_index, raft_term, position, accepted, error.
AUDIT_COLUMNS: tuple[pa.Field, ...] = (SOURCE_FIELD, NODE_ID_FIELD) + tuple(
    arrow_field(f) for f in AUDIT_ENTRY.fields if f.name != "record")
AUDIT_ENTRY_FIELDS = tuple(f.name for f in AUDIT_ENTRY.fields if f.name != "record")

GAP_SCHEMA = pa.schema((SOURCE_FIELD, NODE_ID_FIELD) + tuple(arrow_field(f) for f in AUDIT_GAP.fields))


def arrow_schema(spec: RecordSpec) -> pa.Schema:
    """The schema of ``records/<spec.name>/``: ``AUDIT_COLUMNS`` then the record's own fields."""
    clash = {c.name for c in AUDIT_COLUMNS} & {f.name for f in spec.fields}
    if clash:
        raise ValueError(f"{spec.name}: field(s) {', '.join(sorted(clash))} clash with the audit columns")
    return pa.schema(AUDIT_COLUMNS + tuple(arrow_field(f) for f in spec.fields))


def _int_type(lo: int, hi: int) -> pa.DataType:
    """The narrowest of int8..int64 (records.schema's integer types) that holds [lo, hi]."""
    for name in ("int8", "int16", "int32", "int64"):
        a, b = INT_RANGES[name]
        if a <= lo and hi <= b:
            return FIELD_TYPES[name]
    raise ValueError(f"no integer type holds [{lo}, {hi}]")


OP_COLUMNS = (SOURCE_FIELD, pa.field("process", pa.string(), nullable=False),
               pa.field("owner", pa.string(), nullable=False),
               pa.field("index", pa.int64(), nullable=False), pa.field("time_ns", pa.int64(), nullable=False))


def _value_fields(f: str) -> tuple[pa.Field, ...]:
    """Columns for the value of an ok ``f`` op, from chaos.history.VALUE_SHAPES (a bare range is ``pid``)."""
    shape = VALUE_SHAPES[(f, OK)]
    if isinstance(shape, tuple):
        return (pa.field("pid", _int_type(*shape), nullable=False),)
    return tuple(pa.field(k, _int_type(lo, hi), nullable=False) for k, (lo, hi) in shape.items())


# source, process, owner, index, time_ns, broker_id (int32), broker_epoch, start (int64), length (int32)
CHAOS_ALLOCATE_SCHEMA = pa.schema(OP_COLUMNS + _value_fields(ALLOCATE))
# source, process, owner, index, time_ns, pid (int64)
CHAOS_GENERATE_SCHEMA = pa.schema(OP_COLUMNS + _value_fields(GENERATE))


def record_table(name: str) -> str:
    """The table (directory relative to the export) of a replicated record type."""
    return f"{RECORDS_DIR}/{name}"


def schema_to_json(schema: pa.Schema) -> list[dict]:
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
