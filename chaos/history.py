"""The history of a chaos run: every operation, as JSON lines, in the order it happened (``Op``, its
fields described once in ``OP_FIELDS``): Jepsen's invoke and completion (ok, fail, info), paired by
process and operation.  ``HistoryWriter`` writes it, ``read_history`` validates every line and the
pairing (``HistoryError``); ``read_final``/``write_final`` handle the runner's final-state file.
docs/simulation.md ("The history of a chaos run") gives the format and the torn-last-line policy.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator

log = logging.getLogger(__name__)

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
TYPES = (INVOKE, OK, FAIL, INFO)
COMPLETIONS = (OK, FAIL, INFO)

# Client operations the checker understands; other names are accepted and ignored by it.
ALLOCATE, GENERATE, REGISTER = "allocate", "generate", "register"
NEMESIS_PREFIX = "nemesis"  # "nemesis", "nemesis-2", ...: their ops are faults (f is the fault kind)

LONG_MAX = 2 ** 63 - 1
INT32_MAX = 2 ** 31 - 1

TIME_BASE_NS = time.monotonic_ns()


def now_ns() -> int:
    """The run's clock: monotonic nanoseconds since ``TIME_BASE_NS`` (import of this module)."""
    return time.monotonic_ns() - TIME_BASE_NS


def owner(process: str) -> str:
    """``pidmgr-1`` for ``pidmgr-1/client-3``; a name without "/" is its own owner."""
    return process.split("/", 1)[0]


class HistoryError(Exception):
    """A chaos run's file (history or final state) is missing, empty, torn, foreign or malformed,
    or an in-memory history breaks the rules.

    ``path`` and ``line_no`` (1-based) are None when they do not apply.
    """

    def __init__(self, path: str | None, line_no: int | None, problem: str):
        self.path = None if path is None else os.fspath(path)
        self.line_no = line_no
        self.problem = problem
        where = "" if self.path is None else self.path + (f":{line_no}" if line_no is not None else "")
        super().__init__(f"{where}: {problem}" if where else problem)


# --------------------------------------------------------------------------
# The operation, described once
# --------------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return type(v) is int  # not bool


def _nonneg_int(v: Any) -> bool:
    return type(v) is int and v >= 0


def _name(v: Any) -> bool:
    return isinstance(v, str) and v != ""


_F_RE = re.compile(r"[a-z][a-z0-9_-]*\Z")


@dataclass(frozen=True)
class OpField:
    name: str
    expect: str                   # what a valid value is (for error messages)
    valid: Callable[[Any], bool]  # the check, applied by to_json/from_json/the writer/the reader
    doc: str


OP_FIELDS: tuple[OpField, ...] = (
    OpField("index", "an integer >= 0", _nonneg_int,
            "Position in the history (0-based), assigned by the writer; equals the line number - 1."),
    OpField("time_ns", "an integer >= 0", _nonneg_int, "Monotonic nanoseconds on the run's clock (now_ns())."),
    OpField("process", "a non-empty string", _name,
            'Who did it: "broker-1", "pidmgr-2/client-1", "nemesis", ...; "owner/role" groups processes.'),
    OpField("type", f"one of {', '.join(TYPES)}", lambda v: isinstance(v, str) and v in TYPES,
            "invoke, or the completion: ok, fail, or info (outcome unknown)."),
    OpField("f", "a lower-case name like 'allocate'", lambda v: isinstance(v, str) and bool(_F_RE.match(v)),
            'The operation ("allocate", "generate", "register") or, for the nemesis, the fault kind.'),
    OpField("value", "any JSON value", lambda v: True,
            "Any JSON value; VALUE_SHAPES lists the ones the checker reads, which are checked strictly."),
    OpField("error", "null or a non-empty string", lambda v: v is None or _name(v),
            'Why it failed or is unknown ("COORDINATOR_LOAD_IN_PROGRESS", ...); null on invoke and ok.'),
)
_FIELD_NAMES = tuple(f.name for f in OP_FIELDS)
_KEYS = frozenset(_FIELD_NAMES)
_NAME_FIELDS = tuple(f for f in OP_FIELDS if f.name in ("process", "type", "f", "error"))

# Values the checker reads, validated strictly: (f, type) -> field name -> (min, max).
# A bare (min, max) means "the value is itself an integer in this range".
ALLOCATE_OK_VALUE = {"broker_id": (0, INT32_MAX), "broker_epoch": (0, LONG_MAX), "start": (0, LONG_MAX),
                     "length": (1, INT32_MAX)}
VALUE_SHAPES: dict[tuple[str, str], dict[str, tuple[int, int]] | tuple[int, int]] = {
    (ALLOCATE, OK): ALLOCATE_OK_VALUE,   # the block the quorum returned: [start, start + length)
    (GENERATE, OK): (0, LONG_MAX),       # the producer ID handed out
}


@dataclass(slots=True)
class Op:
    """One line of a history: an invocation or a completion (see the module doc)."""

    process: str
    type: str
    f: str
    value: Any
    time_ns: int
    error: str | None = None
    index: int = -1  # -1 until HistoryWriter.append assigns it

    def to_dict(self) -> dict:
        _validate(self)
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def to_json(self) -> str:
        """One line of JSON (no newline); raises HistoryError if a field is bad or the value is not JSON."""
        d = self.to_dict()
        try:
            return json.dumps(d, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise HistoryError(None, None, f"op #{self.index}: value is not JSON: {e}") from None

    @classmethod
    def from_dict(cls, d: Any) -> "Op":
        if not isinstance(d, dict):
            raise HistoryError(None, None, f"expected a JSON object, got {_json_type(d)}")
        if d.keys() != _KEYS:
            missing = sorted(_KEYS - d.keys())
            unknown = sorted(d.keys() - _KEYS)
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                    ([f"unknown {', '.join(map(str, unknown))}"] if unknown else [])
            raise HistoryError(None, None, f"not an operation: {'; '.join(parts)}")
        op = cls(d["process"], d["type"], d["f"], d["value"], d["time_ns"], d["error"], d["index"])
        _validate(op)
        return op

    @classmethod
    def from_json(cls, text: str) -> "Op":
        try:
            d = _DECODER.decode(text)
        except ValueError as e:
            raise HistoryError(None, None, f"not JSON: {e}") from None
        return cls.from_dict(d)

    @property
    def is_nemesis(self) -> bool:
        return self.process.startswith(NEMESIS_PREFIX)


def _no_constant(name: str):
    raise ValueError(f"{name} is not allowed")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # one decoder: json.loads(**kw) builds one per call


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")


# (process, type, f, error) combinations already found valid: a history repeats a handful of them
# millions of times, so the reader checks each once.
_VALID_NAMES: set[tuple] = set()


def _validate(op: Op) -> None:
    """Check every field of ``op`` (by OP_FIELDS, and VALUE_SHAPES); HistoryError without a path."""
    if not (type(op.index) is int and op.index >= 0 and type(op.time_ns) is int and op.time_ns >= 0):
        for fld in OP_FIELDS[:2]:
            v = getattr(op, fld.name)
            if not fld.valid(v):
                where = "" if fld.name == "index" else f"op #{op.index}: "
                raise HistoryError(None, None, f"{where}{fld.name} must be {fld.expect}, got {v!r}")
    names = (op.process, op.type, op.f, op.error)
    try:
        known = names in _VALID_NAMES
    except TypeError:  # an unhashable value where a string belongs
        known = False
    if not known:
        for fld in _NAME_FIELDS:
            v = getattr(op, fld.name)
            if not fld.valid(v):
                raise HistoryError(None, None, f"op #{op.index}: {fld.name} must be {fld.expect}, got {v!r}")
        if op.error is not None and op.type in (INVOKE, OK):
            raise HistoryError(None, None, f"op #{op.index}: an {op.type} op carries no error (got {op.error!r})")
        if len(_VALID_NAMES) < 65536:
            _VALID_NAMES.add(names)
    shape = VALUE_SHAPES.get((op.f, op.type))
    if shape is None or op.is_nemesis:
        return
    where = f"op #{op.index}"
    v = op.value
    if isinstance(shape, tuple):
        if not _is_int(v) or not shape[0] <= v <= shape[1]:
            raise HistoryError(None, None, f"{where}: {op.f} {op.type} value must be an integer in "
                                           f"[{shape[0]}, {shape[1]}], got {v!r}")
        return
    if not isinstance(v, dict) or v.keys() != shape.keys():
        raise HistoryError(None, None, f"{where}: {op.f} {op.type} value must be an object with exactly "
                                       f"{', '.join(shape)}, got {v!r}")
    for k, (lo, hi) in shape.items():
        if not _is_int(v[k]) or not lo <= v[k] <= hi:
            raise HistoryError(None, None, f"{where}: {op.f} {op.type} value.{k} must be an integer in "
                                           f"[{lo}, {hi}], got {v[k]!r}")
    if op.f == ALLOCATE and v["start"] > LONG_MAX - v["length"]:
        raise HistoryError(None, None, f"{where}: block [{v['start']}, +{v['length']}) passes {LONG_MAX}")


# --------------------------------------------------------------------------
# Pairing invokes with completions
# --------------------------------------------------------------------------

def _double_invoke(op: Op, prev: Op) -> HistoryError:
    return HistoryError(None, None, f"op #{op.index}: {op.process} invokes {op.f} while its {op.f} invoked at "
                                    f"op #{prev.index} is still outstanding")


def _unmatched(op: Op) -> HistoryError:
    return HistoryError(None, None, f"op #{op.index}: {op.type} {op.f} of {op.process} has no matching invoke")


def _before_invoke(op: Op, inv: Op) -> HistoryError:
    return HistoryError(None, None, f"op #{op.index}: completes at {op.time_ns} ns, before its invoke "
                                    f"op #{inv.index} at {inv.time_ns} ns")


class _Pairing:
    """The outstanding invokes, one per (process, f): what the writer and the reader check each op against."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], Op] = {}

    def check(self, op: Op) -> None:
        """Raise HistoryError (no path) if ``op`` cannot come next; changes nothing."""
        inv = self.open.get((op.process, op.f))
        if op.type == INVOKE:
            if inv is not None:
                raise _double_invoke(op, inv)
        elif inv is None:
            raise _unmatched(op)
        elif op.time_ns < inv.time_ns:
            raise _before_invoke(op, inv)

    def add(self, op: Op) -> None:
        self.check(op)
        if op.type == INVOKE:
            self.open[(op.process, op.f)] = op
        else:
            del self.open[(op.process, op.f)]


def pair_ops(ops: Iterable[Op]) -> list[tuple[Op, Op | None]]:
    """(invoke, completion) for every operation, in invoke order; completion None if it never completed.

    Raises HistoryError for a completion without an outstanding invoke of the same
    (process, f), a second outstanding invoke, or a completion before its invoke.
    """
    open_: dict[tuple[str, str], int] = {}  # (process, f) -> position in pairs
    pairs: list[tuple[Op, Op | None]] = []
    for op in ops:  # runs for every op of a million-op history: keep it flat
        key = (op.process, op.f)
        if op.type == INVOKE:
            if key in open_:
                raise _double_invoke(op, pairs[open_[key]][0])
            open_[key] = len(pairs)
            pairs.append((op, None))
        else:
            pos = open_.pop(key, None)
            if pos is None:
                raise _unmatched(op)
            inv = pairs[pos][0]
            if op.time_ns < inv.time_ns:
                raise _before_invoke(op, inv)
            pairs[pos] = (inv, op)
    return pairs


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------

class HistoryWriter:
    """Appends ops to a new history file, one flushed JSON line each.

    Safe to share between threads and between coroutines of an event loop:
    ``append`` holds a lock only around a short buffered write (no await
    inside), so lines never interleave and indexes are dense.  It refuses an
    op the reader would refuse (bad field, broken pairing), so every file it
    writes reads back.  The file must not exist yet (a previous run's history
    is never overwritten).  ``close`` fsyncs.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._f = open(self.path, "xb")
        self._lock = threading.Lock()
        self._pairing = _Pairing()
        self._next = 0

    @staticmethod
    def now_ns() -> int:
        """The run's clock (the module's ``now_ns``)."""
        return now_ns()

    def append(self, op: Op) -> Op:
        """Write ``op`` with the next index and return that indexed copy (``op`` itself is not changed)."""
        with self._lock:
            if self._f.closed:
                raise HistoryError(self.path, None, "history writer is closed")
            out = replace(op, index=self._next)
            line = out.to_json()  # validates
            self._pairing.check(out)
            self._f.write(line.encode("utf-8") + b"\n")
            self._f.flush()
            self._pairing.add(out)
            self._next += 1
            return out

    def __len__(self) -> int:
        return self._next

    def close(self) -> None:
        with self._lock:
            if self._f.closed:
                return
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

class History(list):
    """The ops of a history file (a list of Op), with what the reader had to say about the file."""

    def __init__(self, ops: Iterable[Op] = (), path: str | None = None, warnings: list[str] | None = None):
        super().__init__(ops)
        self.path = path
        self.warnings: list[str] = list(warnings or [])


def _open_for_read(path: str, what: str):
    if os.path.isdir(path):
        raise HistoryError(path, None, f"is a directory, not a {what}")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise HistoryError(path, None, f"no such file (expected a {what})") from None
    except OSError as e:
        raise HistoryError(path, None, f"cannot read: {e.strerror or e}") from None


def read_history(path: str | os.PathLike, *, allow_torn_tail: bool = False) -> History:
    """Every op of a history file, validated; HistoryError for any bad file (see the module doc)."""
    path = os.fspath(path)
    ops = History(path=path)
    ops.extend(iter_history(path, allow_torn_tail=allow_torn_tail, warnings=ops.warnings))
    return ops


def iter_history(path: str | os.PathLike, *, allow_torn_tail: bool = False,
                 warnings: list[str] | None = None) -> Iterator[Op]:
    """The ops of a history file one by one, with every check of ``read_history`` (which is
    built on it), holding only the open invokes: for files too large to keep as Op objects.
    A dropped torn last line is reported in ``warnings``."""
    path = os.fspath(path)
    pairing = _Pairing()
    line_no = 0
    seen = 0
    with _open_for_read(path, "chaos history file") as f:
        try:
            for line_no, raw in enumerate(f, 1):
                try:
                    op = _parse_line(raw)
                except HistoryError as e:
                    if raw.endswith(b"\n"):  # a complete line that is bad: never a torn write
                        hint = " (is this a chaos history file?)" if line_no == 1 else ""
                        raise HistoryError(path, line_no, e.problem + hint) from None
                    if line_no == 1:
                        raise HistoryError(path, 1, f"{e.problem}, and no newline: truncated, or not a chaos "
                                                    "history file") from None
                    if not allow_torn_tail:
                        raise HistoryError(path, line_no, f"truncated last line (no newline; {e.problem}): "
                                                          "the writer was cut off mid-line; reading with "
                                                          "allow_torn_tail checks the ops before it") from None
                    msg = (f"{path}:{line_no}: dropped a torn last line ({len(raw)} bytes, no newline); "
                           "the op it held is treated as never completed (outcome unknown)")
                    log.warning("%s", msg)
                    if warnings is not None:
                        warnings.append(msg)
                    break
                try:
                    if op.index != line_no - 1:
                        raise HistoryError(None, None, f"index {op.index} out of sequence (expected {line_no - 1}):"
                                                       " lines missing, reordered or files joined")
                    pairing.add(op)
                except HistoryError as e:
                    raise HistoryError(path, line_no, e.problem) from None
                seen += 1
                yield op
        except OSError as e:
            raise HistoryError(path, line_no + 1, f"read error: {e.strerror or e}") from None
    if not seen:
        raise HistoryError(path, None, "empty file: no operations recorded")


def _parse_line(raw: bytes) -> Op:
    line = raw.rstrip(b"\n")
    if not line.strip():
        raise HistoryError(None, None, "blank line")
    return Op.from_json(_text(line, None))


def _text(raw: bytes, path: str | None, hint: str = "") -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HistoryError(path, None, f"not UTF-8 text (byte {e.start}{hint})") from None


# --------------------------------------------------------------------------
# The final state the runner saves after a run
# --------------------------------------------------------------------------

# Described once: what ``final`` must hold (extra keys are allowed and ignored).
FINAL_NODE_FIELDS = ("next_producer_id", "commit_index", "last_applied")
AUDIT_BLOCK_FIELDS = ("raft_index", "broker_id", "broker_epoch", "producer_id_start", "producer_id_len")


def validate_final(final: Any, path: str | None = None) -> dict:
    """Check the shape of a final-state dict; HistoryError (with ``path``) if it is wrong.

    ``{"nodes": {node_id: {"next_producer_id", "commit_index", "last_applied"}},
    "audit_blocks": [{"raft_index", "broker_id", "broker_epoch", "producer_id_start",
    "producer_id_len"}, ...]}`` -- all integers >= 0, at least one node.  Other keys are
    allowed; two optional ones are read: ``missing_nodes`` (ids of nodes that did not
    answer) and ``converged`` (false: the nodes had not caught up), both become warnings.
    """
    def bad(problem: str) -> HistoryError:
        return HistoryError(path, None, f"final state: {problem}")

    if not isinstance(final, dict):
        raise bad(f"expected a JSON object, got {_json_type(final)} (is this a chaos final-state file?)")
    for key in ("nodes", "audit_blocks"):
        if key not in final:
            raise bad(f"missing {key!r} (is this a chaos final-state file?)")
    missing = final.get("missing_nodes", [])
    if not isinstance(missing, list):
        raise bad("'missing_nodes' must be a list")
    if not isinstance(final.get("converged", True), bool):
        raise bad("'converged' must be true or false")
    nodes = final["nodes"]
    if not isinstance(nodes, dict) or not nodes:
        why = f" (no node answered after the run; missing: {', '.join(map(str, missing))})" if missing else ""
        raise bad(f"'nodes' must be a non-empty object of node id -> state{why}")
    for node, st in nodes.items():
        if not isinstance(st, dict):
            raise bad(f"node {node}: expected an object, got {_json_type(st)}")
        for k in FINAL_NODE_FIELDS:
            if not _is_int(st.get(k)) or st[k] < 0:
                raise bad(f"node {node}: {k} must be an integer >= 0, got {st.get(k)!r}")
    blocks = final["audit_blocks"]
    if not isinstance(blocks, list):
        raise bad("'audit_blocks' must be a list")
    for i, b in enumerate(blocks):
        if not isinstance(b, dict):
            raise bad(f"audit_blocks[{i}]: expected an object, got {_json_type(b)}")
        for k in AUDIT_BLOCK_FIELDS:
            if not _is_int(b.get(k)) or b[k] < 0:
                raise bad(f"audit_blocks[{i}]: {k} must be an integer >= 0, got {b.get(k)!r}")
        if b["producer_id_len"] < 1:
            raise bad(f"audit_blocks[{i}]: producer_id_len must be >= 1")
    return final


def read_final(path: str | os.PathLike) -> dict:
    """The runner's final-state JSON file, validated (``validate_final``); HistoryError if bad."""
    path = os.fspath(path)
    f = _open_for_read(path, "chaos final-state file")
    with f:
        try:
            raw = f.read()
        except OSError as e:
            raise HistoryError(path, None, f"read error: {e.strerror or e}") from None
    if not raw.strip():
        raise HistoryError(path, None, "empty file: no final state recorded")
    text = _text(raw, path, "; is this a chaos final-state file?")
    try:
        final = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        what = "truncated JSON" if e.pos >= len(text.rstrip()) else "not JSON"
        raise HistoryError(path, e.lineno, f"{what}: {e.msg} (column {e.colno})") from None
    except ValueError as e:
        raise HistoryError(path, None, f"not JSON: {e}") from None
    return validate_final(final, path)


def write_final(path: str | os.PathLike, final: dict) -> None:
    """Validate and write ``final`` atomically (temp file, fsync, rename)."""
    path = os.fspath(path)
    validate_final(final, path)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(final, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
