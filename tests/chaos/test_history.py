"""chaos.history: the op format, the writer, and every kind of bad file the readers refuse."""
from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

from chaos.history import (
    History,
    HistoryError,
    HistoryWriter,
    Op,
    now_ns,
    owner,
    pair_ops,
    read_final,
    read_history,
    write_final,
)
from tests.chaos import Hist, audit_block, clean_run, final_state


def write_ops(path, ops) -> str:
    with HistoryWriter(path) as w:
        for op in ops:
            w.append(op)
    return str(path)


def lines(ops) -> list[str]:
    return [op.to_json() for op in ops]


# --------------------------------------------------------------------------- round trip

def test_round_trip_through_writer_and_reader(tmp_path):
    h, _ = clean_run()
    unindexed = [Op(o.process, o.type, o.f, o.value, o.time_ns, o.error) for o in h.ops]
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        returned = [w.append(op) for op in unindexed]
        assert len(w) == len(h.ops)
    assert [o.index for o in returned] == list(range(len(h.ops)))
    assert all(o.index == -1 for o in unindexed)  # the caller's ops are not changed
    got = read_history(path)
    assert isinstance(got, History) and got.warnings == [] and got.path == str(path)
    assert got == h.ops  # every field, including dict values and errors
    raw = path.read_text().splitlines()
    assert json.loads(raw[1]) == {"index": 1, "time_ns": 2_000_000, "process": "pidmgr-1", "type": "ok",
                                  "f": "allocate", "error": None,
                                  "value": {"broker_id": 1, "broker_epoch": 1, "start": 0, "length": 10}}


def test_op_json_round_trip_keeps_errors_unicode_and_big_ints():
    ops = [Op("broker-1", "invoke", "generate", {"note": "ü", "xs": [1, 2]}, 5, index=0),
           Op("broker-1", "fail", "generate", None, 9, error="COORDINATOR_LOAD_IN_PROGRESS", index=1),
           Op("broker-1", "ok", "generate", 2 ** 63 - 1, 9, index=2)]
    for op in ops:
        assert Op.from_json(op.to_json()) == op
        assert Op.from_dict(op.to_dict()) == op


def test_writer_and_module_share_the_runs_clock(tmp_path):
    with HistoryWriter(tmp_path / "h") as w:
        a = now_ns()
        b = w.now_ns()
        c = now_ns()
    assert 0 <= a <= b <= c


@pytest.mark.parametrize("op, problem", [
    (Op("", "invoke", "generate", None, 0), "process"),
    (Op("p", "done", "generate", None, 0), "type must be one of"),
    (Op("p", "invoke", "Generate", None, 0), "f must be"),
    (Op("p", "invoke", "generate", None, -1), "time_ns"),
    (Op("p", "invoke", "generate", None, True), "time_ns"),
    (Op("p", "invoke", "generate", None, 1.5), "time_ns"),
    (Op("p", "ok", "generate", "7", 0), "generate ok value must be an integer"),
    (Op("p", "ok", "generate", -1, 0), "generate ok value must be an integer"),
    (Op("p", "ok", "generate", 7, 0, error="X"), "carries no error"),
    (Op("p", "fail", "generate", None, 0, error=""), "error must be"),
    (Op("p", "ok", "allocate", {"broker_id": 1, "start": 0, "length": 5}, 0), "exactly"),
    (Op("p", "ok", "allocate", {"broker_id": 1, "broker_epoch": 1, "start": 0, "length": 0}, 0), "value.length"),
    (Op("p", "ok", "allocate", {"broker_id": 1, "broker_epoch": 1, "start": 2 ** 63 - 5, "length": 10}, 0),
     "passes"),
    (Op("p", "ok", "allocate", {"broker_id": 1, "broker_epoch": False, "start": 0, "length": 5}, 0),
     "value.broker_epoch"),
    (Op("p", "invoke", "generate", object(), 0), "not JSON"),
    (Op("p", "invoke", "generate", float("nan"), 0), "not JSON"),
])
def test_op_validation_is_strict(op, problem):
    op.index = 0
    with pytest.raises(HistoryError, match=problem):
        op.to_json()


def test_from_dict_refuses_missing_and_unknown_keys():
    d = Op("p", "invoke", "generate", None, 0, index=0).to_dict()
    with pytest.raises(HistoryError, match="missing error"):
        Op.from_dict({k: v for k, v in d.items() if k != "error"})
    with pytest.raises(HistoryError, match="unknown extra"):
        Op.from_dict({**d, "extra": 1})
    with pytest.raises(HistoryError, match="expected a JSON object, got array"):
        Op.from_dict([1])


def test_owner_is_the_part_before_the_slash():
    assert owner("pidmgr-1/client-3") == "pidmgr-1" and owner("pidmgr-1/alloc") == "pidmgr-1"
    assert owner("broker-2") == "broker-2" and owner("a/b/c") == "a"


def test_nemesis_values_are_free_form():
    op = Op("nemesis", "ok", "partition-leader", {"node": 2, "isolated": [2], "heal_after_s": 1.5}, 0, index=0)
    assert Op.from_json(op.to_json()) == op


# --------------------------------------------------------------------------- writer

def test_writer_is_thread_safe_and_indexes_are_dense(tmp_path):
    path = tmp_path / "h.jsonl"
    n_threads, per = 8, 250
    with HistoryWriter(path) as w:
        def worker(k):
            for _ in range(per):
                inv = w.append(Op(f"broker-{k}", "invoke", "generate", None, w.now_ns()))
                w.append(Op(f"broker-{k}", "ok", "generate", k * per * 10 + inv.index, w.now_ns()))
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    ops = read_history(path)
    assert [o.index for o in ops] == list(range(2 * n_threads * per))
    assert len(pair_ops(ops)) == n_threads * per


def test_writer_is_safe_from_coroutines(tmp_path):
    path = tmp_path / "h.jsonl"

    async def client(w, k):
        for i in range(50):
            w.append(Op(f"broker-{k}", "invoke", "generate", None, w.now_ns()))
            await asyncio.sleep(0)
            w.append(Op(f"broker-{k}", "ok", "generate", k * 1000 + i, w.now_ns()))

    async def main():
        with HistoryWriter(path) as w:
            await asyncio.gather(*(client(w, k) for k in range(10)))

    asyncio.run(main())
    ops = read_history(path)
    assert len(ops) == 1000 and len({o.process for o in ops}) == 10


def test_writer_refuses_what_the_reader_would_refuse(tmp_path):
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        with pytest.raises(HistoryError, match="no matching invoke"):
            w.append(Op("broker-1", "ok", "generate", 1, 0))
        with pytest.raises(HistoryError, match="type must be"):
            w.append(Op("broker-1", "started", "generate", 1, 0))
        w.append(Op("broker-1", "invoke", "generate", None, 10))
        with pytest.raises(HistoryError, match="still outstanding"):
            w.append(Op("broker-1", "invoke", "generate", None, 11))
        with pytest.raises(HistoryError, match="before its invoke"):
            w.append(Op("broker-1", "ok", "generate", 5, 9))
        assert w.append(Op("broker-1", "ok", "generate", 5, 12)).index == 1
    assert [o.index for o in read_history(path)] == [0, 1]  # nothing refused reached the file
    with pytest.raises(HistoryError, match="closed"):
        w.append(Op("broker-1", "invoke", "generate", None, 13))


def test_writer_never_overwrites_an_existing_history(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text("old run\n")
    with pytest.raises(FileExistsError):
        HistoryWriter(path)
    assert path.read_text() == "old run\n"


# --------------------------------------------------------------------------- pairing

def test_pair_ops_keys_on_process_and_operation():
    # A ProducerIdManager's refill task allocates while generate calls are served.
    h = Hist()
    h.invoke("pidmgr-1", "allocate")
    h.invoke("pidmgr-1", "generate")
    h.op("pidmgr-1", "fail", "generate", error="COORDINATOR_LOAD_IN_PROGRESS")
    ok = h.op("pidmgr-1", "ok", "allocate", {"broker_id": 1, "broker_epoch": 1, "start": 0, "length": 5})
    h.invoke("pidmgr-1", "generate")
    h.invoke("nemesis", "kill-leader", {"node": 1})
    pairs = pair_ops(h.ops)
    assert [(i.index, c.index if c else None) for i, c in pairs] == [(0, 3), (1, 2), (4, None), (5, None)]
    assert pairs[0][1] is ok


@pytest.mark.parametrize("build, problem", [
    (lambda h: h.op("broker-1", "ok", "generate", 1), "op #0: ok generate of broker-1 has no matching invoke"),
    (lambda h: (h.invoke("broker-1", "generate"), h.op("broker-2", "info", "generate")), "no matching invoke"),
    (lambda h: (h.invoke("broker-1", "generate"), h.op("broker-1", "ok", "allocate",
                {"broker_id": 1, "broker_epoch": 1, "start": 0, "length": 1})), "no matching invoke"),
    (lambda h: (h.invoke("broker-1", "generate"), h.invoke("broker-1", "generate")),
     "op #1: broker-1 invokes generate while its generate invoked at op #0 is still outstanding"),
    (lambda h: (h.invoke("broker-1", "generate", t_ms=5), h.op("broker-1", "ok", "generate", 1, t_ms=4)),
     "before its invoke"),
])
def test_pair_ops_refuses_broken_pairings(build, problem):
    h = Hist()
    build(h)
    with pytest.raises(HistoryError, match=problem):
        pair_ops(h.ops)


# --------------------------------------------------------------------------- bad files

def _good_lines() -> list[str]:
    h = Hist()
    h.allocate("pidmgr-1", 1, 0, 10)
    h.generate("pidmgr-1", 0)
    return lines(h.ops)


def _bad(tmp_path, content: bytes):
    p = tmp_path / "history.jsonl"
    p.write_bytes(content)
    return p


G = _good_lines()  # 4 lines: invoke/ok allocate, invoke/ok generate
GOOD = "".join(ln + "\n" for ln in G).encode()


@pytest.mark.parametrize("name, content, line_no, problem", [
    ("empty", b"", None, "empty file"),
    ("blank line", b"\n", 1, "blank line"),
    ("blank line in the middle", ("\n".join(G[:2]) + "\n\n" + G[2] + "\n").encode(), 3, "blank line"),
    ("not utf-8", b"\xff\xfe\x00garbage\n", 1, "not UTF-8"),
    ("binary, no newline", b"\x00\x01\x02\x03", 1, "truncated, or not a chaos history file"),
    ("plain text", b"hello world\n", 1, "not JSON.*is this a chaos history file"),
    ("pretty-printed JSON (a final.json)", b'{\n  "nodes": {}\n}\n', 1, "not JSON.*chaos history file"),
    ("foreign JSON lines", b'{"ts": 1, "level": "info", "msg": "hi"}\n', 1, "not an operation: missing"),
    ("JSON array line", b"[1, 2]\n", 1, "expected a JSON object, got array"),
    ("bad field", (G[0] + "\n" + G[1].replace('"type":"ok"', '"type":"done"') + "\n").encode(), 2,
     "type must be one of"),
    ("NaN", (G[0] + "\n" + G[1].replace('"start":0', '"start":NaN') + "\n").encode(), 2, "NaN is not allowed"),
    ("index out of sequence", (G[0] + "\n" + G[2] + "\n").encode(), 2, "index 2 out of sequence"),
    ("two files joined", GOOD + GOOD, 5, "index 0 out of sequence"),
    ("completion without invoke", (G[0] + "\n" + G[1] + "\n" + G[3].replace('"index":3', '"index":2') + "\n").encode(),
     3, "no matching invoke"),
    ("torn last line", GOOD + G[0][:17].encode(), 5, "truncated last line"),
    ("torn last line of NUL bytes", GOOD + b"\x00" * 64, 5, "truncated last line"),
    ("torn only line", G[0][:20].encode(), 1, "truncated, or not a chaos history file"),
    ("bad last line ending in newline", GOOD + b'{"index": 4\n', 5, "not JSON"),
])
def test_bad_history_files_raise_history_error_with_path_and_line(tmp_path, name, content, line_no, problem):
    p = _bad(tmp_path, content)
    with pytest.raises(HistoryError, match=problem) as ei:
        read_history(p)
    e = ei.value
    assert e.path == str(p) and e.line_no == line_no, (name, e)
    assert str(e).startswith(f"{p}:{line_no}: " if line_no else f"{p}: ")


def test_missing_file_and_directory_raise_history_error(tmp_path):
    with pytest.raises(HistoryError, match="no such file") as ei:
        read_history(tmp_path / "nope.jsonl")
    assert ei.value.path == str(tmp_path / "nope.jsonl") and ei.value.line_no is None
    with pytest.raises(HistoryError, match="is a directory"):
        read_history(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file_raises_history_error(tmp_path):
    p = _bad(tmp_path, GOOD)
    p.chmod(0)
    with pytest.raises(HistoryError, match="cannot read"):
        read_history(p)


def test_torn_last_line_can_be_tolerated_and_is_reported(tmp_path, caplog):
    p = _bad(tmp_path, GOOD + G[0][:17].encode())
    ops = read_history(p, allow_torn_tail=True)
    assert [o.index for o in ops] == [0, 1, 2, 3]
    assert len(ops.warnings) == 1 and f"{p}:5: dropped a torn last line" in ops.warnings[0]
    assert "torn last line" in caplog.text


def test_tolerating_a_torn_tail_still_refuses_other_damage(tmp_path):
    for content, line_no in [(GOOD + b'{"index": 4\n', 5),       # ends in a newline: not a torn write
                             (b"\x00" * 10, 1),                   # nothing before it
                             (G[0].encode() + b"\nxx\n" + G[1].encode(), 2)]:  # damage in the middle
        with pytest.raises(HistoryError) as ei:
            read_history(_bad(tmp_path, content), allow_torn_tail=True)
        assert ei.value.line_no == line_no


def test_a_last_line_without_newline_that_parses_is_kept(tmp_path):
    p = _bad(tmp_path, GOOD.rstrip(b"\n"))
    assert len(read_history(p)) == 4


# --------------------------------------------------------------------------- final state

def test_final_state_round_trip(tmp_path):
    _, final = clean_run()
    p = tmp_path / "final.json"
    write_final(p, final)
    assert read_final(p) == final
    assert not (tmp_path / "final.json.tmp").exists()


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file"),
    (b'{"nodes": {"1": {"next_producer_id": 5', "truncated JSON"),
    (b"\x89PNG\r\n\x1a\n\x00", "not UTF-8"),
    (b"hello", "not JSON"),
    (GOOD, "not JSON"),  # a history file passed as the final state
    (b"[]", "expected a JSON object, got array"),
    (b'{"ops": []}', "missing 'nodes'"),
    (b'{"nodes": {}, "audit_blocks": []}', "non-empty"),
    (b'{"nodes": {"1": {"next_producer_id": 5, "commit_index": 1}}, "audit_blocks": []}',
     "node 1: last_applied must be an integer"),
    (b'{"nodes": {"1": {"next_producer_id": "5", "commit_index": 1, "last_applied": 1}}, "audit_blocks": []}',
     "node 1: next_producer_id"),
    (json.dumps(final_state(5, [{**audit_block(1, 1, 0, 5), "producer_id_len": 0}])).encode(), "producer_id_len"),
    (json.dumps(final_state(5, [{"raft_index": 1}])).encode(), r"audit_blocks\[0\]: broker_id"),
    (b'{"nodes": {}, "missing_nodes": [1, 2, 3], "audit_blocks": []}', "no node answered.*missing: 1, 2, 3"),
    (json.dumps({**final_state(5, []), "missing_nodes": "2"}).encode(), "'missing_nodes' must be a list"),
    (json.dumps({**final_state(5, []), "converged": "yes"}).encode(), "'converged' must be true or false"),
])
def test_bad_final_state_files_raise_history_error(tmp_path, content, problem):
    p = tmp_path / "final.json"
    p.write_bytes(content)
    with pytest.raises(HistoryError, match=problem) as ei:
        read_final(p)
    assert ei.value.path == str(p)


def test_missing_final_state_raises_history_error(tmp_path):
    with pytest.raises(HistoryError, match="no such file"):
        read_final(tmp_path / "final.json")
    with pytest.raises(HistoryError, match="is a directory"):
        read_final(tmp_path)
