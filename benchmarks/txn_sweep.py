"""The ``sweep`` phase of the transactions benchmark: transactions against an idempotent producer's flush()
for each cell of a grid of partitions per transaction x messages per transaction (1, 3, 10 x 1, 10, 100),
each cell on topics of its own created with that many partitions, every topic read back and checked
exactly-once.  What it does and checks: docs/benchmarks.md ("Transactions with librdkafka")."""
from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from .harness import log
from .report import fmt_num, table
from .txn_producers import FLUSH_TIMEOUT_S, ROUNDS, WARMUP_UNITS, IdempotentLoop, TxnLoop, alternate, over_idempotent
from .txn_readback import VIOLATIONS, check_topic

GRID_PARTITIONS = (1, 3, 10)
GRID_MESSAGES = (1, 10, 100)
DEFAULT_CELLS = ",".join(f"{p}x{m}" for p in GRID_PARTITIONS for m in GRID_MESSAGES)
MAX_PARTITIONS = 100          # a cell's topics; more is refused as a usage error
MAX_MESSAGES = 10_000         # per transaction
CREATE_TIMEOUT_S = 30.0


def parse_cells(spec: str) -> list[tuple[int, int]]:
    """``"PxM,PxM"`` (partitions x messages per transaction) as [(P, M)], in order, without repeats;
    ValueError saying what is wrong otherwise."""
    cells: list[tuple[int, int]] = []
    for part in (x.strip() for x in spec.split(",")):
        if not part:
            continue
        p, sep, m = part.lower().partition("x")
        if not sep or not p.strip().isdigit() or not m.strip().isdigit():
            raise ValueError(f"{part!r} is not PARTITIONSxMESSAGES (e.g. 3x10)")
        cell = (int(p), int(m))
        if not (1 <= cell[0] <= MAX_PARTITIONS and 1 <= cell[1] <= MAX_MESSAGES):
            raise ValueError(f"{part!r}: partitions must be 1..{MAX_PARTITIONS}, messages 1..{MAX_MESSAGES}")
        if cell not in cells:
            cells.append(cell)
    if not cells:
        raise ValueError("no cell given")
    return cells


def cell_name(partitions: int, messages: int) -> str:
    return f"{partitions}x{messages}"


def create_topics(bootstrap: str, partitions: int, names: list[str]) -> float:
    """CreateTopics for ``names`` with ``partitions`` partitions each (replication factor 1, the broker's
    only); a topic that exists already must have that many.  The seconds it took."""
    t = time.perf_counter()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names],
                                  operation_timeout=CREATE_TIMEOUT_S, request_timeout=CREATE_TIMEOUT_S)
    for name, f in futures.items():
        try:
            f.result(CREATE_TIMEOUT_S)
        except KafkaException as e:
            err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            have = len(admin.list_topics(name, timeout=CREATE_TIMEOUT_S).topics[name].partitions)
            if have != partitions:
                raise RuntimeError(f"topic {name!r} exists with {have} partitions, not {partitions}") from None
    return time.perf_counter() - t


def run_cell(bootstrap: str, partitions: int, messages: int, seconds: float, conf: dict) -> dict:
    """One cell: its two topics, a transactional and an idempotent producer (warm-up, then ROUNDS of
    ``seconds`` per producer in all), both topics read back and checked."""
    name = cell_name(partitions, messages)
    label = f"sweep {name}"
    tx_topic, idem_topic = f"tx-sweep-{name}", f"idem-sweep-{name}"
    create_s = create_topics(bootstrap, partitions, [tx_topic, idem_topic])
    tx = TxnLoop(bootstrap, f"bench-tx-sweep-{name}", tx_topic, conf, partitions=partitions, messages=messages)
    idem = IdempotentLoop(bootstrap, idem_topic, conf, partitions=partitions, messages=messages)
    log(f"{label}: {partitions} partitions x {messages} messages per unit; warm-up ({WARMUP_UNITS} units each)")
    tx.warm_up()
    idem.warm_up()
    round_s = alternate(tx, idem, seconds, label, log)
    tx.close()
    idem.producer.flush(FLUSH_TIMEOUT_S)
    idem.producer = None
    t, i = tx.result(), idem.result()
    log(f"{label}: reading both topics back")
    t["check"] = check_topic(bootstrap, tx_topic, {n: r["outcome"] for n, r in tx.outcomes.items()},
                             partitions, messages)
    i["check"] = check_topic(bootstrap, idem_topic, {n: "committed" for n in idem.flushed_units}, partitions, messages)
    return {"partitions": partitions, "messages": messages, "seconds_per_producer": seconds, "round_s": round_s,
            "create_topics_s": create_s, "transactional": t, "idempotent": i,
            "ratio_transactional_over_idempotent": over_idempotent(t, i)}


def phase_sweep(a, bootstrap: str, conf: dict) -> dict:
    """Every cell of ``a.sweep_cells`` in turn; a cell that raises is recorded (``error``) and the next runs."""
    cells: dict[str, dict] = {}
    for p, m in a.sweep_cells:
        try:
            cells[cell_name(p, m)] = run_cell(bootstrap, p, m, a.sweep_seconds, conf)
        except Exception as e:  # noqa: BLE001 - one cell's failure is a failed check, the others still run
            log(f"sweep {cell_name(p, m)}: {type(e).__name__}: {e}")
            cells[cell_name(p, m)] = {"partitions": p, "messages": m, "error": f"{type(e).__name__}: {e}"}
    return {"cells": cells, "seconds_per_producer": a.sweep_seconds, "rounds": ROUNDS, "warmup_units": WARMUP_UNITS,
            "producer_conf": conf}


# ------------------------------------------------------------------ checks and output


def checks(sweep: dict) -> list[str]:
    """A failed cell, client errors, a topic not read to its end, no unit measured; ``FAIL`` lines for an
    exactly-once violation."""
    out = []
    for name, cell in sweep["cells"].items():
        if "error" in cell:
            out.append(f"sweep {name}: the cell failed: {cell['error']}")
            continue
        for label in ("transactional", "idempotent"):
            x = cell[label]
            c = x["check"]
            if x["errors"] or x.get("delivery_errors"):
                out.append(f"sweep {name} {label}: errors {x['errors']} {x.get('delivery_errors') or ''}".rstrip())
            v = {k: c[k] for k in VIOLATIONS if c.get(k)}
            if v:
                out.append(f"FAIL sweep {name} {label}: exactly-once violated: {v}")
            if not c["settle"]["settled"] or not c["read_complete"]:
                out.append(f"sweep {name} {label}: topic not read to its end (settled {c['settle']['settled']}, "
                           f"read complete {c['read_complete']})")
        if not cell["transactional"]["measured_committed"] or not cell["idempotent"]["measured_units"]:
            out.append(f"sweep {name}: no unit measured (transactional {cell['transactional']['measured_committed']}"
                       f", idempotent {cell['idempotent']['measured_units']})")
    return out


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _read_back(c: dict, with_aborted: bool) -> str:
    figures = [c["lost"], c["duplicated"]] + ([c["aborted_visible"]] if with_aborted else [])
    return "/".join(str(v) for v in figures)


def print_sweep(sweep: dict) -> None:
    rows = []
    for name, cell in sweep["cells"].items():
        if "error" in cell:
            rows.append([name, f"failed: {cell['error'][:60]}"] + ["-"] * 11)
            continue
        t, i, r = cell["transactional"], cell["idempotent"], cell["ratio_transactional_over_idempotent"]
        errors = sum(t["errors"].values()) + sum(t["delivery_errors"].values()) + sum(i["errors"].values())
        rows.append([name, fmt_num(t["transactions_per_s"], ".1f"), fmt_num(i["units_per_s"], ".1f"), _x(r["per_s"]),
                     fmt_num(t["commit"]["p50_ms"], ".2f"), fmt_num(i["flush"]["p50_ms"], ".2f"),
                     _x(r["latency_p50_ms"]), fmt_num(t["commit"]["p99_ms"], ".2f"),
                     fmt_num(i["flush"]["p99_ms"], ".2f"), _x(r["latency_p99_ms"]), errors,
                     _read_back(t["check"], True), _read_back(i["check"], False)])
    print()
    print(table(f"4. sweep: partitions x messages per transaction, one producer of each kind per cell, "
                f"{sweep['seconds_per_producer']:g} s each (rounds {'-'.join(sweep['rounds'])}), no faults; "
                f"latencies in ms",
                ["cell", "tx/s", "idem/s", "tx/idem", "commit p50", "flush p50", "x", "commit p99", "flush p99",
                 "x", "errors", "tx lost/dup/aborted", "idem lost/dup"], rows))
    bad = [n for n, c in sweep["cells"].items() if "error" not in c
           and any(c[k]["check"].get(v) for k in ("transactional", "idempotent") for v in VIOLATIONS)]
    if bad:
        print(f"FAIL: exactly-once violated in sweep cells {', '.join(bad)} (examples in the JSON)")
    else:
        print("  exactly-once: OK in every cell (read_committed: every committed unit whole and once, "
              "nothing aborted seen)")
