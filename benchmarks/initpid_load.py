"""InitProducerId over the wire for the broker benchmark: requests one at a time on one connection, and an
open-loop load (``WireLoad``) that issues every 10 ms the requests owed since its start, counting answers
by error code, latency, the PIDs returned and its own pacer's lateness."""
from __future__ import annotations

import array
import asyncio
import datetime
import time
from collections import Counter

from quorum.client.quorum import Connection, ConnectionFailed
from records.wire import kafka
from records.wire.errors import RequestTimedOutError

from .common import paced
from .report import code_name, summarize_ms

TICK_S = 0.01
INIT_PRODUCER_ID = 22
TXN_TIMEOUT = datetime.timedelta(milliseconds=60_000)
IDEM_CLIENT_TIMEOUT_S = 10.0
TX_CLIENT_TIMEOUT_S = 30.0
STALL_MS = 50.0        # a pacer tick this late counts as a stall of the load generator


def init_body(tid: str | None, pid: int = -1, epoch: int = -1):
    return kafka.request_entity(INIT_PRODUCER_ID, 4, transactional_id=tid, transaction_timeout=TXN_TIMEOUT,
                            producer_id=pid, producer_epoch=epoch)


async def wire_sequential(address: str, bodies, label: str) -> dict:
    """One connection, one request at a time: latency, error codes, (pid, epoch) of each success."""
    conn = Connection(address, f"bench-{label}")
    lat, errors, got = [], Counter(), []
    try:
        for body in bodies:
            t0 = time.perf_counter()
            try:
                resp = await conn.call(body, TX_CLIENT_TIMEOUT_S)
            except RequestTimedOutError:
                errors["CLIENT_TIMEOUT"] += 1
                continue
            except ConnectionFailed:
                errors["CONNECTION_FAILED"] += 1
                continue
            lat.append(time.perf_counter() - t0)
            code = int(resp.error_code)
            if code:
                errors[code_name(code)] += 1
            else:
                got.append((int(resp.producer_id), int(resp.producer_epoch)))
    finally:
        conn.close()
    return {"requests": len(lat) + sum(v for k, v in errors.items() if k in ("CLIENT_TIMEOUT", "CONNECTION_FAILED")),
            "latency": summarize_ms(lat), "errors": dict(errors), "got": got}


class WireLoad:
    """Open-loop InitProducerId v4 requests at ``rate``/s: every 10 ms the requests owed since the start.

    Idempotent (``tx_prefix`` None): round-robin over ``n_conns`` persistent connections.
    Transactional: a new transactional id per request, each on a fresh connection (as distinct
    producers), latency measured from the request's send (after the connect)."""

    def __init__(self, label: str, address: str, rate: float, n_conns: int = 4, tx_prefix: str | None = None,
                 timeout: float = IDEM_CLIENT_TIMEOUT_S):
        self.label, self.address, self.rate, self.tx_prefix, self.timeout = label, address, rate, tx_prefix, timeout
        self.conns = [Connection(address, f"bench-{label}-{i}") for i in range(n_conns)] if tx_prefix is None else []
        self.sent = 0
        self.lat_ok = array.array("d")
        self.lat_err = array.array("d")
        self.pids = array.array("q")
        self.errors: Counter = Counter()
        self.error_times: list[tuple[float, str]] = []
        self.slowest: tuple[float, float] | None = None  # (latency s, issued at s)
        self.max_tick_lag_s = 0.0
        self.stalls: list[tuple[float, float]] = []  # (at s, ms) pacer ticks >= STALL_MS late
        self.tasks: set[asyncio.Task] = set()
        self.t_start = 0.0

    def _error(self, name: str, t_issue: float) -> None:
        self.errors[name] += 1
        if len(self.error_times) < 5000:
            self.error_times.append((round(t_issue - self.t_start, 3), name))

    async def _one(self, n: int) -> None:
        t_issue = time.perf_counter()
        conn = None
        try:
            if self.tx_prefix is None:
                conn, body = self.conns[n % len(self.conns)], init_body(None)
            else:
                conn, body = Connection(self.address, f"bench-{self.label}"), init_body(f"{self.tx_prefix}{n}")
                await conn.connect(self.timeout)
            t0 = time.perf_counter()
            resp = await conn.call(body, self.timeout)
        except RequestTimedOutError:
            self._error(f"CLIENT_TIMEOUT (> {self.timeout:g} s)", t_issue)
            return
        except ConnectionFailed:
            self._error("CONNECTION_FAILED", t_issue)
            return
        finally:
            if self.tx_prefix is not None and conn is not None:
                conn.close()
        dt = time.perf_counter() - t0
        if self.slowest is None or dt > self.slowest[0]:
            self.slowest = (dt, t_issue - self.t_start)
        code = int(resp.error_code)
        if code:
            self.lat_err.append(dt)
            self._error(code_name(code), t_issue)
        else:
            self.lat_ok.append(dt)
            self.pids.append(int(resp.producer_id))

    async def run(self, t_start: float, t_stop: float) -> None:
        self.t_start = t_start
        async for due, now in paced(t_start, TICK_S, time.perf_counter):
            self.max_tick_lag_s = max(self.max_tick_lag_s, now - due)
            if now - due >= STALL_MS / 1000 and len(self.stalls) < 1000:
                self.stalls.append((round(due - t_start, 3), round((now - due) * 1000, 1)))
            owed = int((min(now, t_stop) - t_start) * self.rate) - self.sent
            for _ in range(max(0, owed)):
                t = asyncio.get_running_loop().create_task(self._one(self.sent))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)
                self.sent += 1
            if now >= t_stop:
                break
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        for c in self.conns:
            c.close()

    def result(self, wall: float) -> dict:
        answered = len(self.lat_ok) + len(self.lat_err)
        return {"target_rate_per_s": self.rate, "sent": self.sent, "sent_per_s": self.sent / wall if wall else None,
                "answered": answered, "ok": len(self.lat_ok), "errors": dict(self.errors),
                "latency_ok": summarize_ms(self.lat_ok), "latency_all_answered": summarize_ms(
                    list(self.lat_ok) + list(self.lat_err)),
                "slowest": None if self.slowest is None else {"latency_ms": self.slowest[0] * 1000,
                                                              "issued_at_s": self.slowest[1]},
                "max_pacer_lag_ms": self.max_tick_lag_s * 1000, "pacer_stalls": self.stalls,
                "error_times": self.error_times,
                "error_spells": spells(self.error_times),
                "pids_distinct_within": len(self.pids) == len(set(self.pids))}


def spells(error_times: list, gap: float = 0.5) -> list[dict]:
    """Errors grouped into spells (no two consecutive errors more than ``gap`` s apart)."""
    out: list[dict] = []
    for t, name in error_times:
        if out and t - out[-1]["last_s"] <= gap:
            out[-1]["last_s"] = t
            out[-1]["count"] += 1
            out[-1]["codes"][name] = out[-1]["codes"].get(name, 0) + 1
        else:
            out.append({"first_s": t, "last_s": t, "count": 1, "codes": {name: 1}})
    return out
