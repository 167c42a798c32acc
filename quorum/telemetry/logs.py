"""Process logging for nodes and brokers: human lines (default) or one JSON object per line.

Every line carries the process identity (``node_id`` or ``broker_id``), the
Raft term where the process knows one (``term`` on a node, ``broker_epoch``
on a broker: set with ``set_context_source``), and, for lines logged while a
request is handled, its ``client_id`` and ``correlation_id`` (a contextvar:
each request task binds its own with ``request_context``).

JSON lines have the keys ``ts`` (UTC, ISO 8601, milliseconds), ``level``,
``logger``, ``msg`` and, where known, ``node_id``/``broker_id``, ``term``/
``broker_epoch``, ``client_id``, ``correlation_id``, and ``exc`` (the
traceback) for an exception.  Human lines look like::

    2026-11-21 23:40:01,123 INFO quorum.server [node=1 term=3 req=pidctl#7]: ...
"""
from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
import time
from typing import Any, Callable, TextIO

FORMATS = ("human", "json")

_request: contextvars.ContextVar[tuple[str | None, int] | None] = contextvars.ContextVar("pidquorum_request",
                                                                                          default=None)
_identity: dict[str, Any] = {}
_sources: dict[str, Callable[[], Any]] = {}


def set_identity(**fields: Any) -> None:
    """Fixed fields of every line of this process, e.g. ``set_identity(node_id=1)``."""
    _identity.update(fields)


def set_context_source(name: str, source: Callable[[], Any] | None) -> None:
    """A field read when a line is logged (``term``); ``None`` removes it.  A source that
    fails or returns None leaves the field out of that line."""
    if source is None:
        _sources.pop(name, None)
    else:
        _sources[name] = source


def request_context(client_id: str | None, correlation_id: int) -> contextvars.Token:
    """Tag the lines the current task (and the tasks it starts) logs from now on with this request."""
    return _request.set((client_id, int(correlation_id)))


def end_request_context(token: contextvars.Token) -> None:
    _request.reset(token)


class Throttled:
    """One logger call for an event that can come in floods (a connection refused under a
    connection flood): at most one line per ``interval_s``; the next line says how many were
    left out since the last one, so 10,000 refusals a second are a line every ``interval_s``."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._last: float | None = None
        self.suppressed = 0

    def __call__(self, level: int, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` at ``level`` unless a line went out less than ``interval_s`` ago; True if logged."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            self.suppressed += 1
            return False
        if self.suppressed:
            msg, args = msg + " (%d more like it not logged in the last %.0f s)", (*args, self.suppressed,
                                                                                    now - self._last)
        self._last, self.suppressed = now, 0
        self.logger.log(level, msg, *args)
        return True


class FirstOfEach:
    """One logger line for the first event of each kind, none for the next ones of that kind: a client
    that sends the same refused request on every reconnect, many times a second (an unknown API key, a
    version the server does not serve), is one line, not a flood.  The caller counts every event.

    The kinds come from the network, so at most ``max_kinds`` are remembered; events of kinds past
    that are logged through ``Throttled`` (a line every ``interval_s``)."""

    def __init__(self, logger: logging.Logger, max_kinds: int = 1024, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.max_kinds = logger, max_kinds
        self._seen: set[Any] = set()
        self._overflow = Throttled(logger, interval_s, clock)

    def __call__(self, kind: Any, level: int, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` at ``level`` if no event of ``kind`` was logged before; True if logged."""
        if kind in self._seen:
            return False
        if len(self._seen) >= self.max_kinds:
            return self._overflow(level, msg, *args)
        self._seen.add(kind)
        self.logger.log(level, msg + " (logged once; the next ones are only counted)", *args)
        return True


def context_fields() -> dict[str, Any]:
    out = dict(_identity)
    for name, source in list(_sources.items()):
        try:
            value = source()
        except Exception:  # noqa: BLE001 - a log line never fails because of its context
            value = None
        if value is not None:
            out[name] = value
    req = _request.get()
    if req is not None:
        out["client_id"], out["correlation_id"] = req
    return out


class ContextFilter(logging.Filter):
    """Puts ``context_fields()`` on each record as ``record.pq_context``."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.pq_context = context_fields()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        line: dict[str, Any] = {"ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        line.update(getattr(record, "pq_context", None) or {})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


_SHORT = {"node_id": "node", "broker_id": "broker", "term": "term", "broker_epoch": "epoch"}


class HumanFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(pq_tags)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        ctx = getattr(record, "pq_context", None) or {}
        tags = [f"{_SHORT[k]}={ctx[k]}" for k in _SHORT if k in ctx]
        if "correlation_id" in ctx:
            tags.append(f"req={ctx.get('client_id') or '-'}#{ctx['correlation_id']}")
        record.pq_tags = f" [{' '.join(tags)}]" if tags else ""
        return super().format(record)


def setup_logging(level: str = "INFO", fmt: str = "human", stream: TextIO | None = None) -> None:
    """(Re)configure the root logger: one handler on ``stream`` (stderr) in ``fmt``.

    Calling it again (e.g. once the config file names a format) replaces the handler
    this function installed before, and leaves other handlers (pytest's) alone.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_pidquorum", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._pidquorum = True  # type: ignore[attr-defined]
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else HumanFormatter())
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
