"""Reading an audit export back (the tests' and a user's check of what ``chaos.audit.export`` wrote): its
manifest checked, every listed Parquet file's row count and schema verified, a table's part files."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from chaos.audit.export import FORMAT, KINDS, MANIFEST, ExportError
from chaos.audit.schemas import schema_to_json


def read_manifest(directory: str, verify: bool = True) -> dict:
    """The manifest of a finished export, checked; ExportError naming the file and the problem.

    ``verify``: also check that every listed file exists and that its Parquet footer
    has the listed row count and schema.
    """
    if not os.path.isdir(directory):
        raise ExportError(f"{directory}: no such directory (expected an audit export)")
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise ExportError(f"{directory}: no {MANIFEST}: not a finished audit export (the export writes it "
                          "last; run 'pidctl audit export' again)")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        m = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise ExportError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ExportError(f"{path}: not JSON: {e}") from None

    def bad(problem: str) -> ExportError:
        return ExportError(f"{path}: {problem}")

    if not isinstance(m, dict):
        raise bad("not a JSON object")
    for key in ("format", "sources", "tables", "exported_at"):
        if key not in m:
            raise bad(f"missing {key!r}")
    if m["format"] != FORMAT or type(m["format"]) is not int:
        raise bad(f"format {m['format']!r} is not supported (this build reads format {FORMAT})")
    if not isinstance(m["sources"], list) or not m["sources"]:
        raise bad("'sources' must be a non-empty list")
    for i, s in enumerate(m["sources"]):
        if not isinstance(s, dict) or not all(isinstance(s.get(k), str) for k in ("name", "kind", "path")) \
                or s["kind"] not in KINDS or not isinstance(s.get("counts"), dict):
            raise bad(f"sources[{i}]: expected {{name, kind (one of {', '.join(KINDS)}), path, counts}}")
    if not isinstance(m["tables"], dict):
        raise bad("'tables' must be an object of relative path -> {rows, schema}")
    for rel, t in m["tables"].items():
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or not rel.endswith(".parquet"):
            raise bad(f"table {rel!r}: not a relative path to a .parquet file in the export")
        if not isinstance(t, dict) or type(t.get("rows")) is not int or t["rows"] < 0 \
                or not isinstance(t.get("schema"), list):
            raise bad(f"table {rel}: expected {{rows (an integer >= 0), schema (a list)}}")
        if verify:
            file = os.path.join(directory, *parts)
            if not os.path.isfile(file):
                raise bad(f"lists {rel}, which is missing: the export is incomplete or was changed")
            try:
                meta = pq.read_metadata(file)
                schema = meta.schema.to_arrow_schema()
            except (OSError, pa.ArrowException) as e:
                raise ExportError(f"{file}: not a readable Parquet file: {e}") from None
            if meta.num_rows != t["rows"]:
                raise bad(f"{rel} has {meta.num_rows} rows, the manifest says {t['rows']}")
            if schema_to_json(schema) != t["schema"]:
                raise bad(f"{rel}: its schema differs from the manifest's")
    return m


def table_files(directory: str, manifest: dict, table: str) -> list[str]:
    """Paths of the part files of ``table`` (e.g. ``records/AllocateProducerIdsRecord``, ``chaos/generate``)."""
    prefix = table.rstrip("/") + "/"
    return [os.path.join(directory, *rel.split("/")) for rel in sorted(manifest["tables"])
            if rel.startswith(prefix) and "/" not in rel[len(prefix):]]
