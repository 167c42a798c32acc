"""Transactional InitProducerId in parallel over several brokers: the ``init_burst`` phase of
``pidctl bench transactions``.

Its own three-node cluster and ``brokers`` broker processes; ``connections`` persistent connections to each
broker (InitProducerId v4 over the wire, pipelined).  Four loads of ``ids`` requests each, spread round-robin
over every connection:

1. idempotent burst: every request sent at once, no transactional id.  The broker answers these from a block it
   holds (no quorum round trip): the floor of this client, these brokers and this machine for the same number
   of requests, measured in the same run;
2. transactional burst, new ids: every request sent at once, each a transactional id the quorum has not seen;
3. transactional burst, epoch bumps: the same ids again with the producer ID and epoch each was given (KIP-360),
   every request at once;
4. transactional, closed loop: new ids again, one request in flight per connection.

Latency is per request, from its send to its answer.  Checked: every answer without an error; every id of a
burst a producer ID of its own, none an idempotent one; each bump the same producer ID at the next epoch.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

from quorum.client.quorum import Connection, ConnectionFailed
from records.wire.errors import RequestTimedOutError

from .common import temp_cluster
from .harness import log
from .initpid_load import init_body
from .processes import BrokerProcess
from .report import code_name, fmt_num, summarize_ms, table

IDS = 2000
BROKERS = 3
CONNECTIONS = 16            # per broker
CALL_TIMEOUT_S = 60.0
TARGET_P99_MS = 50.0        # transactional burst, new ids (the target)


class _Load:
    """One load's requests and answers."""

    def __init__(self, name: str):
        self.name = name
        self.latency: list[float] = []
        self.errors: Counter = Counter()
        self.got: dict[int, tuple[int, int]] = {}  # request index -> (producer id, epoch)
        self.wall_s = 0.0
        self.sent = 0

    async def one(self, conn: Connection, index: int, body) -> None:
        self.sent += 1
        t0 = time.perf_counter()
        try:
            resp = await conn.call(body, CALL_TIMEOUT_S)
        except RequestTimedOutError:
            self.errors[f"CLIENT_TIMEOUT (> {CALL_TIMEOUT_S:g} s)"] += 1
            return
        except ConnectionFailed:
            self.errors["CONNECTION_FAILED"] += 1
            return
        self.latency.append(time.perf_counter() - t0)
        if int(resp.error_code):
            self.errors[code_name(int(resp.error_code))] += 1
        else:
            self.got[index] = (int(resp.producer_id), int(resp.producer_epoch))

    def result(self) -> dict:
        return {"requests": self.sent, "answered_ok": len(self.got), "wall_ms": self.wall_s * 1000,
                "per_s": len(self.got) / self.wall_s if self.wall_s else None,
                "latency": summarize_ms(self.latency), "errors": dict(self.errors)}


async def _run_load(load: _Load, conns: list[Connection], bodies: list, closed: bool) -> None:
    t = time.perf_counter()
    if closed:
        async def lane(k: int) -> None:
            for i in range(k, len(bodies), len(conns)):
                await load.one(conns[k], i, bodies[i])
        await asyncio.gather(*(lane(k) for k in range(len(conns))))
    else:
        await asyncio.gather(*(load.one(conns[i % len(conns)], i, b) for i, b in enumerate(bodies)))
    load.wall_s = time.perf_counter() - t


async def _loads(addresses: list[str], ids: int, connections: int, prefix: str) -> dict:
    conns = [Connection(a, f"bench-init-burst-{b}-{k}") for b, a in enumerate(addresses) for k in range(connections)]
    try:
        for c in conns:
            await c.connect(10.0)
        # One request on each connection first: connections and the brokers' first block are not measured.
        warm = _Load("warm-up")
        await _run_load(warm, conns, [init_body(None) for _ in conns], closed=False)
        idem, new, bump, closed = (_Load(n) for n in ("idempotent_burst", "transactional_burst",
                                                         "transactional_bump_burst", "transactional_closed_loop"))
        await _run_load(idem, conns, [init_body(None) for _ in range(ids)], closed=False)
        tids = [f"{prefix}-{i}" for i in range(ids)]
        await _run_load(new, conns, [init_body(t) for t in tids], closed=False)
        # The bumps: each id with what it was given, on the same connection as before.
        bumped = sorted(new.got)
        await _run_load(bump, conns, [init_body(tids[i], *new.got[i]) for i in bumped], closed=False)
        bump.got = {bumped[j]: v for j, v in bump.got.items()}
        await _run_load(closed, conns, [init_body(f"{prefix}-closed-{i}") for i in range(ids)], closed=True)
        return {"warm_up": warm, "idempotent_burst": idem, "transactional_burst": new,
                "transactional_bump_burst": bump, "transactional_closed_loop": closed}
    finally:
        for c in conns:
            c.close()


def _check(loads: dict) -> dict:
    """The PIDs: distinct per transactional id, none an idempotent one, bumps the same PID at the next epoch."""
    idem = {p for p, _ in loads["idempotent_burst"].got.values()} | {p for p, _ in loads["warm_up"].got.values()}
    new, closed, bump = loads["transactional_burst"].got, loads["transactional_closed_loop"].got, \
        loads["transactional_bump_burst"].got
    tx_pids = [p for p, _ in new.values()] + [p for p, _ in closed.values()]
    bad_bumps = [i for i, (p, e) in bump.items() if (p, e) != (new[i][0], new[i][1] + 1)]
    return {"transactional_pids": len(tx_pids), "transactional_pids_shared": len(tx_pids) - len(set(tx_pids)),
            "transactional_pids_also_idempotent": len(set(tx_pids) & idem),
            "new_ids_not_epoch_0": sum(1 for _, e in list(new.values()) + list(closed.values()) if e != 0),
            "bumps_wrong": len(bad_bumps), "bump_examples": [(i, new[i], bump[i]) for i in bad_bumps[:5]]}


def phase_init_burst(a) -> dict:
    ids, n_brokers, connections = a.init_ids, a.init_brokers, a.init_connections
    with contextlib.ExitStack() as stack:
        lc, directory = stack.enter_context(temp_cluster("pidquorum-bench-init-burst-", a.keep, "init_burst",
                                                         subdir="cluster", tail_lines=20))
        brokers = []
        for b in range(1, n_brokers + 1):
            broker = BrokerProcess(directory, b, lc.client_addresses(), "--log-level", a.broker_log_level,
                                   new_session=True)
            stack.callback(broker.stop)
            brokers.append(broker.start())
        log(f"init_burst: {ids} InitProducerId per load over {n_brokers} brokers x {connections} connections: "
            f"idempotent burst, transactional burst (new ids), bumps, closed loop")
        loads = asyncio.run(_loads([b.bootstrap for b in brokers], ids, connections, "bench-init-burst"))
        out = {name: load.result() for name, load in loads.items() if name != "warm_up"}
        out.update({"ids": ids, "brokers": n_brokers, "connections_per_broker": connections,
                    "check": _check(loads), "target_p99_ms": TARGET_P99_MS,
                    "broker_anomalies": {str(b.broker_id): b.anomalies() for b in brokers}})
        return out


def checks(ph: dict) -> list[str]:
    out = []
    for name in ("idempotent_burst", "transactional_burst", "transactional_bump_burst", "transactional_closed_loop"):
        if ph[name]["errors"]:
            out.append(f"init_burst {name}: errors {ph[name]['errors']}")
    c = ph["check"]
    if c["transactional_pids_shared"] or c["transactional_pids_also_idempotent"]:
        out.append(f"FAIL init_burst: a producer ID handed out twice ({c['transactional_pids_shared']} shared by "
                   f"transactional ids, {c['transactional_pids_also_idempotent']} also idempotent)")
    if c["bumps_wrong"] or c["new_ids_not_epoch_0"]:
        out.append(f"FAIL init_burst: {c['bumps_wrong']} bumps not the same producer ID at the next epoch "
                   f"(e.g. {c['bump_examples']}), {c['new_ids_not_epoch_0']} new ids not at epoch 0")
    return out


def print_table(ph: dict) -> None:
    floor = ph["idempotent_burst"]["latency"]
    rows = []
    for name, label in (("idempotent_burst", "idempotent, all at once (no quorum step: the floor)"),
                        ("transactional_burst", "transactional new ids, all at once"),
                        ("transactional_bump_burst", "transactional epoch bumps, all at once"),
                        ("transactional_closed_loop", "transactional new ids, 1 in flight per connection")):
        x = ph[name]
        lat = x["latency"]
        rows.append([label, x["answered_ok"], fmt_num(lat["p50_ms"], ".1f"), fmt_num(lat["p99_ms"], ".1f"),
                     fmt_num(lat["max_ms"], ".1f"), fmt_num(x["wall_ms"], ",.0f"), fmt_num(x["per_s"], ",.0f"),
                     "-" if name == "idempotent_burst" or not floor["p99_ms"] or lat["p99_ms"] is None
                     else f"{lat['p99_ms'] / floor['p99_ms']:.1f}x",
                     "; ".join(f"{k} x{v}" for k, v in sorted(x["errors"].items())) or "0"])
    print(table(f"InitProducerId v4, {ph['ids']:,} per load over {ph['brokers']} brokers x "
                f"{ph['connections_per_broker']} connections", ["load", "ok", "p50 ms", "p99 ms", "max ms", "wall ms",
                                                                "per s", "p99 / floor", "errors"], rows))
    c = ph["check"]
    print(f"  producer IDs: {c['transactional_pids']:,} transactional, {c['transactional_pids_shared']} shared, "
          f"{c['transactional_pids_also_idempotent']} also idempotent; bumps wrong {c['bumps_wrong']}")


def add_arguments(ap) -> None:
    ap.add_argument("--init-ids", type=int, default=IDS, help=f"init_burst: requests per load ({IDS})")
    ap.add_argument("--init-brokers", type=int, default=BROKERS, help=f"init_burst: broker processes ({BROKERS})")
    ap.add_argument("--init-connections", type=int, default=CONNECTIONS,
                    help=f"init_burst: connections per broker ({CONNECTIONS})")
