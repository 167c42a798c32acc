"""The targets of "transactions near the speed of idempotence", judged on one run of the transactions
benchmark, with Kafka's and Redpanda's published figures beside them.

The published figures come from other setups (hardware, message size, batching, commit interval, the Java
client, a different workload); they are context, not comparable one-to-one with this run.  They are
paraphrased from their sources (PUBLISHED); docs/benchmarks.md lists the same, and a test checks that the
docs name every source."""
from __future__ import annotations

from .report import fmt_num, table

# ------------------------------------------------------------------ published figures
# What each source states, paraphrased, and its setup.  A figure not found is None ("no published figure
# found"), never a guess.
SOURCES: dict[str, dict] = {
    "confluent-2017": {
        "title": "Transactions in Apache Kafka", "by": "Apurva Mehta, Jason Gustafson (Confluent blog)",
        "date": "2017", "url": "https://www.confluent.io/blog/transactions-apache-kafka/",
        "setup": "Kafka's producer (the post's API is the Java client's) writing 1 KB records at its maximum "
                 "throughput, committing every 100 ms, so many records per transaction; no hardware stated; the "
                 "post adds that smaller records or shorter commit intervals cost more, a transaction's overhead "
                 "not depending on how many messages it holds"},
    "redpanda-2021": {
        "title": "Kafka-compatible fast distributed transactions", "by": "Denis Rystsov (Vectorized, now Redpanda)",
        "date": "2021-09-14", "url": "https://vectorized.io/blog/fast-transactions/",
        "setup": "3-node cluster of i3.large (NVMe SSD, one availability zone); Java client API; transactional "
                 "stream processing (send and sendOffsetsToTransaction in one transaction) against plain "
                 "send plus commitSync; median latency of the two; the Kafka figure is Redpanda's measurement; "
                 "only the start of the post could be read here"},
    "redpanda-p99conf-2021": {
        "title": "Is It Faster to Go with Redpanda Transactions than Without Them?!",
        "by": "Denis Rystsov (P99 CONF 2021 talk, abstract)", "date": "2021",
        "url": "https://www.p99conf.io/session/is-it-faster-to-go-with-redpanda-transactions-than-without-them/",
        "setup": "the abstract states no hardware, message size, batching or client; an upper bound (\"up to\"), "
                 "credited to a transaction being a unit of work the system can optimise as a whole"},
    "jepsen-redpanda-2022": {
        "title": "Jepsen: Redpanda 21.10.1", "by": "Kyle Kingsbury (Jepsen)", "date": "2022-04-29",
        "url": "https://jepsen.io/analyses/redpanda-21.10.1",
        "setup": "Redpanda 21.10.1 to 21.11.2 and development builds to 2022-01-30 under Jepsen's fault "
                 "injection, with regular Kafka clients; a safety audit, not a count of lost or duplicated "
                 "messages under leader kills"},
    "kip-98": {
        "title": "KIP-98 - Exactly Once Delivery and Transactional Messaging",
        "by": "Jason Gustafson, Flavio Junqueira, Apurva Mehta, Sriram, Guozhang Wang (Apache Kafka wiki)",
        "date": "2016-11-30 (created)",
        "url": "https://cwiki.apache.org/confluence/display/KAFKA/KIP-98+-+Exactly+Once+Delivery+and+"
               "Transactional+Messaging",
        "setup": "the KIP's text as found holds no performance figure; its authors shared performance results "
                 "as a spreadsheet on the Kafka dev list, not readable here"},
}

NOT_FOUND = "no published figure found"


def _fig(figure: str, source: str, states: str) -> dict:
    return {"figure": figure, "source": source, "states": states}


# target id -> {"kafka": figure | None, "redpanda": figure | None}; "figure" is the table's short form,
# "states" what the source says, paraphrased.
PUBLISHED: dict[str, dict] = {
    "commit_p50": {
        "kafka": _fig("6.3x median", "redpanda-2021",
                      "Kafka's transactional processing against plain streaming, median latency, measured by "
                      "Redpanda in the same post (the text read here breaks off after the ratio)"),
        "redpanda": _fig("4.6x median (2.8 / 0.6 ms)", "redpanda-2021",
                         "Redpanda's transactional processing had 4.6x the median latency of plain streaming: "
                         "2.8 ms against 0.6 ms")},
    "commit_p99": {"kafka": None, "redpanda": None},
    "throughput": {
        "kafka": _fig("0.97x (3% lower)", "confluent-2017",
                      "a producer of 1 KB records at maximum throughput committing every 100 ms lost about 3% of "
                      "its throughput to transactions"),
        "redpanda": _fig("up to 8x", "redpanda-p99conf-2021",
                         "Redpanda's optimisations pushed the throughput of distributed transactions up to eight "
                         "times that of an equivalent non-transactional workload")},
    "leader_kill": {
        "kafka": None,
        "redpanda": _fig("Jepsen: 7 safety issues", "jepsen-redpanda-2022",
                         "three liveness and seven safety issues found, among them aborted reads and lost or stale "
                         "messages; seven of the ten resolved at publication")},
    "init_burst": {"kafka": None, "redpanda": None},
}

# ------------------------------------------------------------------ the targets
LATENCY_LIMIT = 3.0           # commit p50 (p99) at most 3x the idempotent flush p50 (p99)
THROUGHPUT_FLOOR = 0.4        # transactions/s at least 0.4x idempotent flushes/s
KILL_EVERY_S = 5.0            # the leader SIGKILLed at least this often
INIT_BURST_P99_MS = 50.0      # transactional InitProducerId, 2,000 in parallel over three brokers
TARGET_CELL = "3x10"          # the partitions x messages the first three targets are stated for

TARGETS = {  # id -> the table's label
    "commit_p50": f"commit p50 <= {LATENCY_LIMIT:g}x flush p50 (3x10)",
    "commit_p99": f"commit p99 <= {LATENCY_LIMIT:g}x flush p99 (3x10)",
    "throughput": f"tx/s >= {THROUGHPUT_FLOOR:g}x idempotent flushes/s (3x10)",
    "leader_kill": f"leader SIGKILL every {KILL_EVERY_S:g} s: 0 lost/dup/aborted",
    "init_burst": f"2,000 tx InitProducerId, 3 brokers: p99 <= {INIT_BURST_P99_MS:g} ms",
}


def _comparison(res: dict) -> tuple[dict, dict, dict, str] | None:
    """(transactional, idempotent, ratios, where) for 3 partitions x 10 messages: the steady phase, else the
    sweep's 3x10 cell; None if neither ran."""
    s = res["phases"].get("steady")
    if s:
        return s["transactional"], s["idempotent"], s["ratio_transactional_over_idempotent"], "steady"
    cell = (res["phases"].get("sweep") or {}).get("cells", {}).get(TARGET_CELL)
    if cell and "error" not in cell:
        return (cell["transactional"], cell["idempotent"], cell["ratio_transactional_over_idempotent"],
                f"sweep {TARGET_CELL}")
    return None


def _row(tid: str, measured: str | None, value, met: bool | None, where: str | None) -> dict:
    return {"id": tid, "target": TARGETS[tid], "measured": "not run" if measured is None else measured,
            "value": value, "met": met, "from": where, "published": PUBLISHED[tid]}


def _latency_row(tid: str, q: str, cmp_) -> dict:
    if cmp_ is None:
        return _row(tid, None, None, None, None)
    t, i, r, where = cmp_
    v = r[f"latency_{q}_ms"]
    if v is None:
        return _row(tid, "no figure (no commit or flush measured)", None, False, where)
    return _row(tid, f"{v:.2f}x ({t['commit'][f'{q}_ms']:.2f} / {i['flush'][f'{q}_ms']:.2f} ms, {where})", v,
                v <= LATENCY_LIMIT, where)


def _throughput_row(cmp_) -> dict:
    if cmp_ is None:
        return _row("throughput", None, None, None, None)
    t, i, r, where = cmp_
    v = r["per_s"]
    if v is None:
        return _row("throughput", "no figure (no unit measured)", None, False, where)
    return _row("throughput", f"{v:.2f}x ({t['transactions_per_s']:.1f} / {i['units_per_s']:.1f} per s, {where})",
                v, v >= THROUGHPUT_FLOOR, where)


def _leader_kill_row(res: dict) -> dict:
    k = res["phases"].get("leader_kill")
    if not k:
        return _row("leader_kill", None, None, None, None)
    c = k["check"]
    v = {"lost": c["lost"], "duplicated": c["duplicated"], "aborted_visible": c["aborted_visible"],
         "kills": k["kills"], "kill_every_s": k["kill_every_s"]}
    text = (f"{c['lost']}/{c['duplicated']}/{c['aborted_visible']}; {k['kills']} kills, every "
            f"{k['kill_every_s']:g} s, {k['measured_committed']} committed")
    clean = c["lost"] == c["duplicated"] == c["aborted_visible"] == 0 and c["read_complete"] and c["settle"]["settled"]
    judged = k["kills"] >= 1 and k["kill_every_s"] <= KILL_EVERY_S and k["measured_committed"] > 0
    if not judged:
        text += " (not the target's load)"
    return _row("leader_kill", text, v, clean and judged, "leader_kill")


def _init_burst_row(res: dict) -> dict:
    """Fed by the ``init_burst`` phase (benchmarks/txn_init_burst.py) once it is part of the run."""
    b = res["phases"].get("init_burst")
    if not b:
        return _row("init_burst", None, None, None, None)
    v = ((b.get("transactional_burst") or {}).get("latency") or {}).get("p99_ms")
    idem = ((b.get("idempotent_burst") or {}).get("latency") or {}).get("p99_ms")
    if v is None:
        return _row("init_burst", "no figure (no transactional burst measured)", None, False, "init_burst")
    return _row("init_burst", f"p99 {v:.1f} ms (idempotent p99 {fmt_num(idem, '.1f')} ms)", v,
                v <= INIT_BURST_P99_MS, "init_burst")


def _sweep_rows(res: dict) -> list[dict]:
    """The two latency targets over every cell of the sweep (if it ran): how many cells meet them."""
    sweep = res["phases"].get("sweep")
    if not sweep or not sweep.get("cells"):
        return []
    out = []
    for q in ("p50", "p99"):
        ratios = {n: c["ratio_transactional_over_idempotent"][f"latency_{q}_ms"] for n, c in sweep["cells"].items()
                  if "error" not in c}
        have = {n: v for n, v in ratios.items() if v is not None}
        within = [n for n, v in have.items() if v <= LATENCY_LIMIT]
        worst = max(have, key=have.get) if have else None
        text = (f"{len(within)} of {len(sweep['cells'])} cells"
                + (f"; worst {have[worst]:.2f}x ({worst})" if worst else ""))
        out.append({"id": f"sweep_commit_{q}",
                    "target": f"commit {q} <= {LATENCY_LIMIT:g}x flush {q}, every sweep cell",
                    "measured": text, "value": {"within": len(within), "cells": len(sweep["cells"]),
                                                "ratios": ratios},
                    "met": len(within) == len(sweep["cells"]), "from": "sweep",
                    "published": PUBLISHED[f"commit_{q}"]})
    return out


def evaluate(res: dict) -> list[dict]:
    """Each target with this run's figure (or "not run"), met True / False (None: not run), and the
    published figures beside it."""
    cmp_ = _comparison(res)
    return [_latency_row("commit_p50", "p50", cmp_), _latency_row("commit_p99", "p99", cmp_),
            _throughput_row(cmp_), *_sweep_rows(res), _leader_kill_row(res), _init_burst_row(res)]


# ------------------------------------------------------------------ output
def _met(m: bool | None) -> str:
    return "not run" if m is None else "yes" if m else "NO"


def print_targets(rows: list[dict]) -> None:
    """The targets table, then what each published figure's source states, and its setup."""
    refs = {k: n + 1 for n, k in enumerate(SOURCES)}

    def pub(p: dict | None) -> str:
        return NOT_FOUND if p is None else f"{p['figure']} [{refs[p['source']]}]"

    print()
    print(table("Targets (same run, same broker, default config); published figures beside them come from other "
                "setups: context, not comparable one-to-one",
                ["target", "this run", "met", "Kafka (published)", "Redpanda (published)"],
                [[r["target"], r["measured"], _met(r["met"]), pub(r["published"]["kafka"]),
                  pub(r["published"]["redpanda"])] for r in rows]))
    for key, n in refs.items():
        s = SOURCES[key]
        print(f"  [{n}] {s['by']}, \"{s['title']}\", {s['date']}, {s['url']}")
        print(f"      setup: {s['setup']}")
        for tid, figs in PUBLISHED.items():
            for vendor, f in figs.items():
                if f is not None and f["source"] == key:
                    print(f"      {vendor}, {TARGETS[tid]}: {f['states']}")
