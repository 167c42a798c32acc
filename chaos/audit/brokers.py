"""The audit's per-broker figures, on Spark: allocation rates per time window, brokers that look like a
restart loop (KIP-936), and when each ID space runs out at its observed rate."""
from __future__ import annotations

import datetime
from typing import Any

from pyspark.sql import functions as F

from chaos.audit.options import Options
from records.schema import LONG_MAX

ID_MAX = LONG_MAX - 1  # the last usable producer ID (2**63-2)
CHART_BROKERS = 8


def broker_rates(timed, register, sources: list[str], o: Options) -> tuple[dict, dict, dict]:
    """Blocks and registrations per broker and time window; brokers that look like a restart loop (many
    registrations or broker epochs in a window, or a window far above the fleet's median); the series to
    chart and each source's observed rate.  ``timed``: the issued quorum block rows that have a window
    (None without blocks); ``register``: the registration rows (None if there are none); ``sources``: the
    source names by number (a source that only registrations name is appended)."""
    out: dict[str, Any] = {"window_ms": o.window_ms,
                           "thresholds": {"registrations_per_window": o.restart_registrations,
                                          "epochs_per_window": o.restart_epochs,
                                          "rate_factor_over_fleet_median": o.rate_factor,
                                          "rate_min_blocks": o.rate_min_blocks},
                           "count": 0, "per_broker": [], "restart_loops": {"count": 0, "examples": []}}
    per: dict[tuple[str, int], dict] = {}
    projections: dict[str, dict] = {}
    rq = None
    if timed is not None:
        rq = (timed.groupBy("src", "broker_id", "win")
              .agg(F.sum("n").alias("blocks"), F.sum(F.col("ids").cast("decimal(38,0)")).alias("ids"),
                   F.countDistinct("broker_epoch").alias("epochs"))
              .persist())
        span = {r["src"]: r for r in rq.groupBy("src").agg(
            F.percentile_approx("blocks", 0.5).alias("median"), F.min("win").alias("w0"),
            F.max("win").alias("w1"), F.sum("ids").alias("ids")).collect()}
        for r in (rq.groupBy("src", "broker_id")
                  .agg(F.sum("blocks").alias("blocks"), F.sum("ids").alias("ids"),
                       F.count(F.lit(1)).alias("windows"),
                       F.percentile_approx("blocks", 0.5).alias("median"),
                       F.max(F.struct("blocks", "win")).alias("peak"),
                       F.max(F.struct("epochs", "win")).alias("peak_epochs"),
                       F.min("win").alias("w0"), F.max("win").alias("w1"))
                  .collect()):
            src = sources[r["src"]]
            fm = span[r["src"]]["median"] or 0
            reasons = []
            peak = r["peak"]["blocks"]
            if peak >= o.rate_min_blocks and peak >= o.rate_factor * max(fm, 1):
                reasons.append(f"{peak} blocks in one window ({peak / max(fm, 1):.0f}x the fleet median {fm})")
            if r["peak_epochs"]["epochs"] >= o.restart_epochs:
                reasons.append(f"{r['peak_epochs']['epochs']} broker epochs in one window")
            per[(src, r["broker_id"])] = {
                "source": src, "broker_id": r["broker_id"], "blocks": r["blocks"], "ids": int(r["ids"]),
                "windows": r["windows"], "median_blocks_per_window": r["median"],
                "fleet_median_blocks_per_window": fm,
                "peak_blocks_per_window": peak, "peak_window_start_ms": r["peak"]["win"] * o.window_ms,
                "max_epochs_per_window": r["peak_epochs"]["epochs"],
                "first_window_ms": r["w0"] * o.window_ms, "last_window_end_ms": (r["w1"] + 1) * o.window_ms,
                "registrations": 0, "max_registrations_per_window": 0, "reasons": reasons}
        projections = _projections(rq, span, sources, o)
    if register is not None:
        reg = (register.filter("accepted").dropDuplicates(["source", "raft_index", "position"])
               .select("source", "broker_id", "broker_epoch",
                       F.when(F.col("timestamp_ms") >= 0, F.expr(f"timestamp_ms DIV {o.window_ms}L")).alias("win"))
               .groupBy("source", "broker_id", "win").agg(F.count(F.lit(1)).alias("n"))
               .groupBy("source", "broker_id")
               .agg(F.sum("n").alias("total"),
                    F.max(F.when(F.col("win").isNotNull(), F.struct("n", "win"))).alias("peak"))
               .collect())
        for r in reg:
            if r["source"] not in sources:
                sources.append(r["source"])
            b = per.setdefault((r["source"], r["broker_id"]), {
                "source": r["source"], "broker_id": r["broker_id"], "blocks": 0, "ids": 0, "windows": 0,
                "median_blocks_per_window": None, "fleet_median_blocks_per_window": None,
                "peak_blocks_per_window": 0, "peak_window_start_ms": None, "max_epochs_per_window": 0,
                "first_window_ms": None, "last_window_end_ms": None, "reasons": []})
            b["registrations"] = r["total"]
            pk = r["peak"]
            b["max_registrations_per_window"] = pk["n"] if pk else 0
            if pk and pk["n"] >= o.restart_registrations:
                at = datetime.datetime.fromtimestamp(pk["win"] * o.window_ms / 1000, datetime.timezone.utc)
                b["reasons"].insert(0, f"{pk['n']} registrations in one window "
                                       f"(from {at.isoformat(timespec='seconds')})")
    brokers = sorted(per.values(), key=lambda b: (not b["reasons"], -b["ids"], b["source"], b["broker_id"]))
    loops = [b for b in brokers if b["reasons"]]
    out["count"] = len(brokers)
    out["per_broker"] = brokers
    out["restart_loops"] = {"count": len(loops), "examples": [
        {"source": b["source"], "broker_id": b["broker_id"], "reasons": b["reasons"]} for b in loops[:o.examples]]}
    series = _series(rq, brokers, sources) if rq is not None else {}
    if rq is not None:
        rq.unpersist()
    return out, series, projections

def _projections(rq, span: dict, sources: list[str], o: Options) -> dict:
    """Observed rate per source: IDs of timed quorum blocks per second over the last 24 h of windows
    that saw allocations (all of them if the history is shorter); ``finish_projection`` turns it into
    when the ID space runs out."""
    if not span:  # no timed quorum block (e.g. only chaos histories): no rate
        return {}
    day = max(1, 86_400_000 // o.window_ms)
    cond = None
    for k, v in span.items():
        c = (F.col("src") == k) & (F.col("win") > v["w1"] - day)
        cond = c if cond is None else cond | c
    recent = {r["src"]: r for r in rq.filter(cond).groupBy("src").agg(
        F.min("win").alias("w0"), F.sum("ids").alias("ids")).collect()}
    out = {}
    for k, v in span.items():
        r = recent[k]
        from_ms, to_ms = r["w0"] * o.window_ms, (v["w1"] + 1) * o.window_ms
        out[sources[k]] = {
            "timed_ids": int(v["ids"]), "timed_from_ms": v["w0"] * o.window_ms, "timed_to_ms": to_ms,
            "rate_from_ms": from_ms, "rate_ids": int(r["ids"]),
            "rate_ids_per_s": int(r["ids"]) / ((to_ms - from_ms) / 1000.0)}
    return out

def _series(rq, brokers: list[dict], sources: list[str]) -> dict:
    """Blocks per window for the brokers worth drawing (restart-loop suspects first, then the largest)."""
    pick: dict[str, list[int]] = {}
    for b in brokers:
        if b["windows"] and len(pick.setdefault(b["source"], [])) < CHART_BROKERS:
            pick[b["source"]].append(b["broker_id"])
    if not pick:
        return {}
    idx = {s: i for i, s in enumerate(sources)}
    cond = None
    for src, ids in pick.items():
        c = (F.col("src") == idx[src]) & F.col("broker_id").isin(ids)
        cond = c if cond is None else cond | c
    out: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for r in rq.filter(cond).select("src", "broker_id", "win", "blocks").collect():
        out.setdefault(sources[r["src"]], {}).setdefault(r["broker_id"], []).append((r["win"], r["blocks"]))
    flagged = {(b["source"], b["broker_id"]) for b in brokers if b["reasons"]}
    return {src: {"brokers": {str(b): sorted(v) for b, v in d.items()},
                  "flagged": [b for b in d if (src, b) in flagged]} for src, d in out.items()}


def finish_projection(report: dict) -> None:
    """Years and date when each ID space runs out at its observed rate (fills ``id_space``)."""
    for src, s in report.get("id_space", {}).items():
        nxt = s.get("next_id")
        if nxt is None:
            continue
        s["remaining_ids"] = max(0, ID_MAX + 1 - nxt)
        s["used_fraction"] = nxt / (ID_MAX + 1)
        rate = s.get("rate_ids_per_s")
        s["exhausted_in_years"] = None
        s["exhausted_at"] = None
        if rate:
            secs = s["remaining_ids"] / rate
            s["exhausted_in_years"] = secs / (365.25 * 86400)
            last = s.get("timed_to_ms")
            if last is not None and secs < 7000 * 365.25 * 86400:
                at = datetime.datetime.fromtimestamp(last / 1000, datetime.timezone.utc) + datetime.timedelta(seconds=secs)
                s["exhausted_at"] = at.isoformat(timespec="seconds")
