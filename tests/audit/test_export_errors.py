"""chaos.audit.export on bad input (missing, corrupt, torn, an existing destination, a failed publish),
read_manifest on what is not a finished export, and `pidctl audit export` exit codes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from chaos.audit import export as ex
from chaos.audit.export import ExportError, export
from chaos.audit.manifest import read_manifest
from chaos.history import HistoryError, read_history
from cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from cli.main import cli
from quorum.trail import _frame
from records import AllocateProducerIdsRecord, AuditEntry
from records.codec import to_obj
from snapshots.storage.disk import CorruptFileError
from tests.audit.export_sources import REPO, assert_nothing_left, write_chaos_dir, write_node


# --------------------------------------------------------------------------- bad input

def test_missing_empty_and_sourceless_inputs(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(ExportError, match=r"nope: no such file or directory"):
        export(str(tmp_path / "nope"), out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"empty: empty directory: nothing to export"):
        export(str(tmp_path / "empty"), out)
    (tmp_path / "other" / "x").mkdir(parents=True)
    (tmp_path / "other" / "x" / "file.txt").write_text("hi")
    with pytest.raises(ExportError, match=r"other: no audit trail or chaos history found"):
        export(str(tmp_path / "other"), out)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match=r"file: not a directory"):
        export(str(tmp_path / "file"), out)
    assert_nothing_left(out)


def test_corrupt_audit_log_names_the_file_and_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    write_chaos_dir(str(src / "good"))
    bad = write_node(str(src / "zz" / "node-2"))
    with open(bad, "r+b") as f:  # flip a byte inside the first line's body: more lines follow it
        f.seek(12)
        b = f.read(1)
        f.seek(12)
        f.write(bytes([b[0] ^ 0xFF]))
    out = str(tmp_path / "out")
    with pytest.raises(CorruptFileError) as e:
        export(str(src), out)
    assert e.value.path == bad and bad in str(e.value)
    assert_nothing_left(out)


def test_audit_line_whose_entry_and_record_disagree_is_corrupt(tmp_path):
    d = tmp_path / "node-1"
    d.mkdir()
    entry = AuditEntry(raft_index=1, raft_term=1, position=0, accepted=True, error=None, record="RegisterBrokerRecord")
    rec = AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=0, producer_id_len=10)
    (d / "audit.log").write_bytes(_frame([to_obj(entry), to_obj(rec)]))
    with pytest.raises(CorruptFileError, match="says RegisterBrokerRecord but holds a AllocateProducerIdsRecord"):
        export(str(d), str(tmp_path / "out"))


BAD_HISTORIES = {
    "empty": b"",
    "foreign": b"this is not json\n",
    "bad-line-mid-file": None,       # built below from a good file
    "index-out-of-sequence": None,
    "unmatched-completion": None,
    "torn-last-line": None,
    "negative-pid": None,
    "not-utf8": b"\xff\xfe\n",
}


def bad_history(kind: str, good: bytes) -> bytes:
    lines = good.splitlines(keepends=True)
    if BAD_HISTORIES[kind] is not None:
        return BAD_HISTORIES[kind]
    if kind == "bad-line-mid-file":
        return b"".join(lines[:5] + [b"{oops\n"] + lines[6:])
    if kind == "index-out-of-sequence":
        return b"".join(lines[:5] + lines[6:])
    if kind == "unmatched-completion":
        return lines[1].replace(b'"index":1,', b'"index":0,')  # an ok with no invoke before it
    if kind == "torn-last-line":
        return b"".join(lines[:-1]) + lines[-1][:-10]
    if kind == "negative-pid":
        i = next(i for i, ln in enumerate(lines) if b'"ok","f":"generate"' in ln)
        return b"".join(lines[:i] + [lines[i].replace(b'"value":1000', b'"value":-1')] + lines[i + 1:])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", sorted(BAD_HISTORIES))
def test_bad_history_gives_exactly_read_historys_error(tmp_path, kind):
    good_dir = write_chaos_dir(str(tmp_path / "good"), with_audit=False)
    good = open(os.path.join(good_dir, "history.jsonl"), "rb").read()
    run_dir = tmp_path / "src" / "run"
    shutil.copytree(good_dir, run_dir)
    (run_dir / "history.jsonl").write_bytes(bad_history(kind, good))
    with pytest.raises(HistoryError) as want:
        read_history(run_dir / "history.jsonl")
    out = str(tmp_path / "out")
    with pytest.raises(HistoryError) as got:
        export(str(tmp_path / "src"), out)
    assert str(got.value) == str(want.value)
    assert str(run_dir / "history.jsonl") in str(got.value)
    assert_nothing_left(out)


def test_torn_history_tail_can_be_allowed(tmp_path):
    run_dir = write_chaos_dir(str(tmp_path / "run"), with_audit=False)
    h = os.path.join(run_dir, "history.jsonl")
    data = open(h, "rb").read()
    open(h, "wb").write(data[:-10])
    out = str(tmp_path / "out")
    m = export(run_dir, out, allow_torn_tail=True)
    c = m["sources"][0]["counts"]
    assert c["torn_tail_lines"] == 1 and c["history_ops"] == len(read_history(h, allow_torn_tail=True))


def test_non_empty_destination_needs_force_and_force_replaces_the_previous_export(tmp_path):
    write_node(str(tmp_path / "a" / "node-1"))
    write_chaos_dir(str(tmp_path / "b" / "run"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty.*--force"):
        export(str(tmp_path / "a"), str(out))
    assert sorted(os.listdir(out)) == ["keep.txt"]
    first = export(str(tmp_path / "b"), str(out), force=True)
    second = export(str(tmp_path / "a"), str(out), force=True)
    # nothing of the first export is left: its chaos tables and part files are gone
    assert not os.path.exists(out / "chaos")
    files = sorted(os.path.relpath(os.path.join(d, f), out).replace(os.sep, "/")
                   for d, _, fs in os.walk(out) for f in fs)
    assert files == sorted(["keep.txt", "manifest.json", *second["tables"]])
    assert set(first["tables"]) != set(second["tables"])
    assert read_manifest(str(out)) == second


def test_a_failing_export_leaves_the_previous_one_intact(tmp_path):
    write_node(str(tmp_path / "src" / "a" / "node-1"))
    out = str(tmp_path / "out")
    before = export(str(tmp_path / "src"), out)
    bad = write_node(str(tmp_path / "src" / "b" / "node-1"))
    with open(bad, "r+b") as f:
        f.seek(12)
        f.write(b"\x00\x00")
    with pytest.raises(CorruptFileError):
        export(str(tmp_path / "src"), out, force=True)
    assert read_manifest(out) == before
    assert not [n for n in os.listdir(out) if n.startswith(".")]


def test_an_export_cut_off_while_publishing_has_no_manifest(tmp_path, monkeypatch):
    write_node(str(tmp_path / "src" / "node-1"))
    out = str(tmp_path / "out")
    export(str(tmp_path / "src"), out)

    def boom(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ex, "atomic_write", boom)
    with pytest.raises(ExportError, match="out: cannot write: No space left on device"):
        export(str(tmp_path / "src"), out, force=True)
    with pytest.raises(ExportError, match="no manifest.json: not a finished audit export"):
        read_manifest(out)


def test_export_into_its_own_input_is_refused(tmp_path):
    write_node(str(tmp_path / "x" / "node-1"))
    with pytest.raises(ExportError, match="overwrite its own input"):
        export(str(tmp_path / "x"), str(tmp_path / "x"), force=True)
    (tmp_path / "out" / "records").mkdir(parents=True)
    write_node(str(tmp_path / "out" / "records" / "node-1"))
    with pytest.raises(ExportError, match="overwrite its own input"):
        export(str(tmp_path / "out" / "records" / "node-1"), str(tmp_path / "out"), force=True)


# --------------------------------------------------------------------------- read_manifest

def test_read_manifest_refuses_what_is_not_a_finished_export(tmp_path):
    with pytest.raises(ExportError, match="no such directory"):
        read_manifest(str(tmp_path / "nope"))
    with pytest.raises(ExportError, match="no manifest.json: not a finished audit export"):
        read_manifest(str(tmp_path))
    write_node(str(tmp_path / "src" / "node-1"))
    out = tmp_path / "out"
    m = export(str(tmp_path / "src"), str(out))
    man = out / "manifest.json"

    def expect(obj, pattern):
        man.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        with pytest.raises(ExportError, match=pattern) as e:
            read_manifest(str(out))
        assert str(man) in str(e.value) or "part-src" in str(e.value)

    expect("{not json", "not JSON")
    expect([], "not a JSON object")
    expect({**m, "format": 2}, "format 2 is not supported")
    expect({k: v for k, v in m.items() if k != "tables"}, "missing 'tables'")
    expect({**m, "sources": [{"name": "x", "kind": "weird", "path": "/", "counts": {}}]}, r"sources\[0\]")
    rel = "records/AllocateProducerIdsRecord/part-src.parquet"
    expect({**m, "tables": {**m["tables"], rel: {**m["tables"][rel], "rows": 5}}}, "has 1 rows, the manifest says 5")
    expect({**m, "tables": {**m["tables"], "../x.parquet": m["tables"][rel]}}, "not a relative path")
    expect({**m, "tables": {**m["tables"], "records/Nope/part-x.parquet": m["tables"][rel]}}, "which is missing")
    man.write_text(json.dumps(m))
    os.truncate(out / "records" / "AllocateProducerIdsRecord" / "part-src.parquet", 10)
    with pytest.raises(ExportError, match="not a readable Parquet file"):
        read_manifest(str(out))
    assert read_manifest(str(out), verify=False) == m


# --------------------------------------------------------------------------- the CLI

def test_cli_export_and_exit_codes(tmp_path):
    runner = CliRunner()
    run_dir = write_chaos_dir(str(tmp_path / "src" / "run"))
    out = str(tmp_path / "out")
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", out, "-o", "json"])
    assert r.exit_code == EXIT_OK, r.output
    shown = json.loads(r.output)
    assert shown["rows"] == sum(t["rows"] for t in shown["tables"].values())
    assert {k: shown[k] for k in ("format", "sources", "tables", "exported_at")} == read_manifest(out)
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", out])
    assert r.exit_code == EXIT_ERROR and "not empty" in r.output
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", out, "--force"])
    assert r.exit_code == EXIT_OK and "rows/s" in r.output
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "nope"), "--to", str(tmp_path / "o2")])
    assert r.exit_code == EXIT_ERROR and "nope: no such file or directory" in r.output
    open(os.path.join(run_dir, "history.jsonl"), "ab").write(b"garbage\n")
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", str(tmp_path / "o3")])
    assert r.exit_code == EXIT_ERROR and os.path.join(run_dir, "history.jsonl") in r.output
    assert not os.path.exists(tmp_path / "o3")
    r = runner.invoke(cli, ["audit", "export", "--to", str(tmp_path / "o4")])
    assert r.exit_code == EXIT_USAGE


@pytest.mark.parametrize("damage", ["audit", "history"])
def test_pidctl_prints_one_line_naming_the_file_and_exits_1(tmp_path, damage):
    run_dir = write_chaos_dir(str(tmp_path / "run"))
    if damage == "audit":
        target = os.path.join(run_dir, "cluster", "node-3", "audit.log")
        with open(target, "r+b") as f:
            f.seek(12)
            f.write(b"\xff\xff\xff")
    else:
        target = os.path.join(run_dir, "history.jsonl")
        open(target, "ab").write(b"[1,2]\n")
    p = subprocess.run([sys.executable, "-m", "cli.main", "audit", "export", "--from", run_dir, "--to",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == EXIT_ERROR, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert err.startswith("error:") and target in err and "Traceback" not in err and len(err.splitlines()) <= 2
    assert not os.path.exists(tmp_path / "out")
