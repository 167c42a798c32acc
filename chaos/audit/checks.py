"""The audit's checks, on Spark: was any producer ID issued twice, over the whole exported history?

Overlaps between issued blocks of one ID space, duplicate chaos PIDs, the migration boundary, gaps,
per-broker allocation rates and restart-loop suspects, and when the ID space runs out.  Overlaps are
found in one ordered pass (``_main_pass``): a running maximum of block ends over ID-space buckets, a
window function per bucket with a carry row for what came before it.  The checks and why that pass is
exact are in docs/simulation.md, section 13, "The checks" and "How overlaps are found".
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import Window as W
from pyspark.sql import functions as F

from chaos.audit.brokers import broker_rates
from chaos.audit.buckets import Buckets, plan_buckets
from chaos.audit.inputs import FORMAT, Table
from chaos.audit.options import Options, Timer
from records.schema import LONG_MAX

ZK, QUORUM, CHAOS = 0, 1, 2
CARRIED = 9  # a carry row: the block with the greatest end in earlier buckets, identified later
KIND_NAMES = {ZK: "zookeeper", QUORUM: "quorum", CHAOS: "chaos"}
ISSUED, REFUSED, ACK, DISAGREE = 0, 1, 2, 3


def run_checks(spark, tables: dict[str, Table], opts: Options, timer: Timer,
               spaces: dict[str, str] | None = None) -> dict:
    """Every check over the validated ``tables``: the report's findings (``run_audit`` adds how it ran).
    ``spaces``: source name -> ID space (``chaos.audit.job.id_spaces``)."""
    return _Checks(spark, tables, opts, timer, spaces).run()


class _Checks:
    def __init__(self, spark, tables: dict[str, Table], opts: Options, timer: Timer,
                 spaces: dict[str, str] | None = None):
        self.spark = spark
        self.t = tables
        self.o = opts
        self.timer = timer
        self.df = {name: t.dataframe(spark) for name, t in tables.items()}
        renamed = {k: v for k, v in (spaces or {}).items() if k != v}
        if renamed:  # from here on, "source" is the ID space: every check groups by it
            pairs = [F.lit(x) for kv in sorted(renamed.items()) for x in kv]
            space = F.coalesce(F.element_at(F.create_map(*pairs), F.col("source")), F.col("source"))
            self.df = {name: df.withColumn("source", space) for name, df in self.df.items()}
        self.sources: list[str] = []

    # ------------------------------------------------------------ blocks
    def _blocks(self):
        """Every block row of every table, one schema: kind, start, end (exclusive), who, where."""
        a, s, c = self.df["alloc"], self.df["seed"], self.df["chaos_allocate"]
        cols = ["source", "kind", "start", "end", "broker_id", "broker_epoch", "ref", "pos", "accepted", "ts"]
        q = a.select("source", F.lit(QUORUM).alias("kind"), F.col("producer_id_start").alias("start"),
                     (F.col("producer_id_start") + F.col("producer_id_len").cast("bigint")).alias("end"),
                     F.col("broker_id").cast("int").alias("broker_id"), F.col("broker_epoch").cast("bigint"),
                     F.col("raft_index").alias("ref"), F.col("position").alias("pos"), "accepted",
                     F.col("timestamp_ms").alias("ts"))
        z = s.select("source", F.lit(ZK).alias("kind"), F.col("zk_block_start").alias("start"),
                     (F.col("zk_block_end") + F.lit(1)).alias("end"), F.col("zk_broker").cast("int").alias("broker_id"),
                     F.lit(-1).cast("bigint").alias("broker_epoch"), F.col("raft_index").alias("ref"),
                     F.col("position").alias("pos"), "accepted", F.col("timestamp_ms").alias("ts"))
        ch = c.select("source", F.lit(CHAOS).alias("kind"), F.col("start").cast("bigint").alias("start"),
                      (F.col("start").cast("bigint") + F.col("length").cast("bigint")).alias("end"),
                      F.col("broker_id").cast("int").alias("broker_id"),
                      F.col("broker_epoch").cast("bigint").alias("broker_epoch"),
                      F.col("index").cast("bigint").alias("ref"), F.lit(0).alias("pos"), F.lit(True).alias("accepted"),
                      F.lit(-1).cast("bigint").alias("ts"))
        parts = [df for name, df in (("alloc", q), ("seed", z), ("chaos_allocate", ch)) if self.t[name].rows]
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out.select(*cols)

    def _plan_buckets(self) -> Buckets:
        names = [n for n in ("alloc", "seed", "chaos_allocate") if self.t[n].rows]
        total = sum(self.t[n].rows for n in names)
        if all(self.t[n].pieces is not None for n in names):
            pieces = [p for n in names for p in self.t[n].pieces]
        else:  # a file without statistics: one uniform segment from a min/max pass
            r = self._blocks().agg(F.min("start"), F.max("start")).collect()[0]
            pieces = [(r[0], r[1], total)]
        return plan_buckets(pieces, total, self.o.buckets)

    def run(self) -> dict:
        rep: dict[str, Any] = {"format": FORMAT}
        has_blocks = any(self.t[n].rows for n in ("alloc", "seed", "chaos_allocate"))
        buckets = self._plan_buckets() if has_blocks else Buckets((0,), (1,), 1)
        rep["_buckets"] = buckets.count
        if has_blocks:
            blocks = buckets.add_to(self._blocks())
            carry = self._carry_pass(blocks)
            self.timer.lap("carry_pass")
            R = self._main_pass(blocks, carry, buckets)
            self.timer.lap("main_pass")
            rep.update(self._block_results(R))
            self.timer.lap("block_results")
            rep["checks"]["migration_boundary"] = self._boundary()
        else:
            rep.update(self._empty_block_results())
            rep["checks"]["migration_boundary"] = {"count": 0, "seeds": 0, "examples": []}
        self.timer.lap("boundary")
        rep["checks"]["duplicate_pids"] = self._duplicate_pids()
        self.timer.lap("duplicate_pids")
        rep["brokers"], series, projections = self._brokers(R if has_blocks else None)
        self.timer.lap("brokers")
        for src, p in projections.items():
            rep["id_space"].setdefault(src, {}).update(p)
        rep["_series"] = series
        rep["sources"] = self.sources
        checks = rep["checks"]
        rep["valid"] = not (checks["overlaps"]["count"] or checks["duplicate_pids"]["count"]
                            or checks["migration_boundary"]["count"])
        rep["violations"] = {k: checks[k]["count"] for k in ("overlaps", "duplicate_pids", "migration_boundary")}
        if has_blocks:
            R.unpersist()
        return rep

    # ------------------------------------------------------------ pass 1: carry rows
    def _carry_pass(self, blocks) -> list[tuple[int, int, int]]:
        """Per (source, bucket), the greatest end of an accepted block; then, per bucket, the greatest of all
        earlier buckets of the same source: the carry row that goes first into the bucket's window.
        (Only the end: a maximum over a struct would force a sort-based aggregation.  The carried block
        is looked up by its end when an example names it, see ``_resolve_carried``.)"""
        agg = (blocks.groupBy("source", "bucket")
               .agg(F.max(F.when(F.col("accepted"), F.col("end"))).alias("m"))
               .collect())
        self.sources = sorted({r["source"] for r in agg})
        index = {s: i for i, s in enumerate(self.sources)}
        carry = []
        best: dict[str, int] = {}
        for r in sorted(agg, key=lambda r: (r["source"], r["bucket"])):
            src = r["source"]
            b = best.get(src)
            if b is not None:
                carry.append((index[src], r["bucket"], b))
            if r["m"] is not None and (b is None or r["m"] > b):
                best[src] = r["m"]
        return carry

    # ------------------------------------------------------------ pass 2: the ordered scan
    def _main_pass(self, blocks, carry: list[tuple], buckets: Buckets):
        o = self.o
        nb = buckets.count
        if len(self.sources) <= 64:
            src_idx = None
            for i, name in enumerate(self.sources):
                src_idx = (F.when(F.col("source") == name, F.lit(i)) if src_idx is None
                           else src_idx.when(F.col("source") == name, F.lit(i)))
            rows = blocks.withColumn("src", src_idx)
        else:
            lookup = self.spark.createDataFrame(list(enumerate(self.sources)), "src int, source string")
            rows = blocks.join(F.broadcast(lookup), "source")
        # Narrow rows through the shuffle (every column costs 8 bytes a row): position and accepted share
        # "pa" = position * 2 + (0 if accepted else 1), which also sorts accepted copies first; the
        # time window replaces the timestamp; carry rows are kind CARRIED with start -1.
        win = F.when((F.col("kind") == QUORUM) & (F.col("ts") >= 0), F.expr(f"ts DIV {o.window_ms}L"))
        rows = rows.select((F.col("src").cast("bigint") * nb + F.col("bucket")).alias("g"), "start", "end",
                           "broker_id", "broker_epoch", "kind", "ref",
                           (F.col("pos").cast("bigint") * 2 + F.when(F.col("accepted"), 0).otherwise(1)).alias("pa"),
                           win.alias("win"))
        if carry:
            schema = ("g bigint, start bigint, end bigint, broker_id int, broker_epoch bigint, kind int, ref bigint, "
                      "pa bigint, win bigint")
            rows = rows.unionByName(self.spark.createDataFrame(
                [(src * nb + bucket, -1, end, -1, -1, CARRIED, -1, 0, None) for src, bucket, end in carry], schema))

        w = W.partitionBy("g").orderBy("start", "end", "broker_id", "broker_epoch", "kind", "ref", "pa")
        before = w.rowsBetween(W.unboundedPreceding, -1)
        lagged = ("start", "end", "broker_id", "broker_epoch", "kind", "ref", "pa")
        extra = [F.lag(c).over(w).alias(f"p_{c}") for c in lagged]
        accepted = F.col("pa") % 2 == 0
        content = F.struct("start", "end", "broker_id", "broker_epoch")
        with_chaos = self.t["chaos_allocate"].rows > 0
        if with_chaos:  # the content of the last accepted quorum record before this row
            extra.append(F.last(F.when((F.col("kind") == QUORUM) & accepted, content), ignorenulls=True)
                         .over(before).alias("lq"))
        # The running maximum needs no de-duplication: a node's copy of a record, a ZooKeeper block seeded
        # twice and a chaos acknowledgement of a record all have the record's own (end, start) and sort
        # after it, so they never change the maximum any later row sees.  So it shares one window operator
        # (one buffering of each bucket) with the lags.
        extra.append(F.max(F.when(accepted, F.struct(
            "end", "start", (-F.col("kind")).alias("nkind"), "ref", F.expr("CAST(pa DIV 2 AS INT)").alias("pos"),
            "broker_id", "broker_epoch"))).over(before).alias("pm"))
        x = rows.select("*", *extra)

        def p(c):
            return F.col(f"p_{c}")
        same = ((p("start") == F.col("start")) & (p("end") == F.col("end")) & (p("broker_id") == F.col("broker_id"))
                & (p("broker_epoch") == F.col("broker_epoch")))
        copy = same & (p("kind") == F.col("kind")) & (
            (F.col("kind") == ZK) | ((F.col("kind") == QUORUM) & (p("ref") == F.col("ref"))
                                     & (F.expr("p_pa DIV 2") == F.expr("pa DIV 2"))))
        if with_chaos:
            ack = ((F.col("kind") == CHAOS) & F.coalesce(F.col("lq") == content, F.lit(False))
                   & ~F.coalesce(same & (p("kind") == CHAOS), F.lit(False)))
        else:
            ack = F.lit(False)
        x = x.select("*", F.coalesce(copy, F.lit(False)).alias("copy"), F.coalesce(ack, F.lit(False)).alias("ack"))
        x = x.withColumn("issued", accepted & ~F.col("copy") & ~F.col("ack"))
        x = x.withColumn("disagree", F.col("copy") & (F.col("kind") == QUORUM) & (p("pa") % 2 != F.col("pa") % 2))
        x = x.filter((F.col("kind") != CARRIED) & (~F.col("copy") | F.col("disagree")))
        status = (F.when(F.col("disagree"), DISAGREE).when(F.col("ack"), ACK)
                  .when(F.col("issued"), ISSUED).otherwise(REFUSED))
        overlap = F.col("issued") & (F.col("start") < F.col("pm.end"))
        gap = F.when(F.col("issued") & (F.col("start") > F.col("pm.end")), F.col("start") - F.col("pm.end"))
        x = x.select(F.expr(f"CAST(g DIV {nb}L AS INT)").alias("src"), "kind", "start", "end", "broker_id",
                     "broker_epoch", "ref", F.expr("CAST(pa DIV 2 AS INT)").alias("pos"), "win", "pm",
                     status.alias("status"), F.coalesce(overlap, F.lit(False)).alias("overlap"), gap.alias("gap"))
        interesting = F.col("overlap") | F.col("gap").isNotNull() | (F.col("status") == DISAGREE)
        xid = F.when(interesting, F.struct("start", "end", "ref", "pos", "overlap", "gap", "pm"))
        R = (x.select("src", "kind", "status", "broker_id", "broker_epoch", "win", xid.alias("x"), "start", "end")
             .groupBy("src", "kind", "status", "broker_id", "broker_epoch", "win", "x")
             .agg(F.count(F.lit(1)).alias("n"),
                  # Long sums stay exact: the rows of a group without x are issued blocks that overlap no
                  # earlier block, so they are disjoint and their lengths add up to less than 2**63; a group
                  # with x is one block.  (Refused rows may overlap anything: not summed.)
                  F.sum(F.when(F.col("status") == ISSUED, F.col("end") - F.col("start"))).alias("ids"),
                  F.min("start").alias("min_start"), F.max("end").alias("max_end")))
        R = R.persist()
        R.count()
        return R

    # ------------------------------------------------------------ results from R
    def _describe(self, kind: int, start: int, end: int, broker: int, epoch: int, ref: int, pos: int) -> dict:
        d: dict[str, Any] = {"kind": KIND_NAMES[kind], "start": start, "end": end, "length": end - start,
                             "broker_id": broker}
        if kind == QUORUM:
            d.update(broker_epoch=epoch, raft_index=ref, position=pos)
        elif kind == ZK:
            d.update(seed_raft_index=ref, seed_position=pos)
        else:
            d.update(broker_epoch=epoch, op_index=ref)
        return d

    def _empty_block_results(self) -> dict:
        return {"blocks": {"issued": 0, "ids_issued": 0, "by_kind": {}, "refused_records": 0,
                           "chaos_acks_matched": 0},
                "checks": {"overlaps": {"count": 0, "ids_reissued": 0, "examples": []},
                           "node_disagreements": {"count": 0, "examples": []}},
                "gaps": {"count": 0, "wasted_ids": 0, "examples": []}, "id_space": {}}

    def _block_results(self, R) -> dict:
        n_ex = self.o.examples
        tot = (R.groupBy("src", "kind", "status")
               .agg(F.sum("n").alias("n"), F.sum(F.col("ids").cast("decimal(38,0)")).alias("ids"),
                    F.min("min_start").alias("min_start"),
                    F.max("max_end").alias("max_end"),
                    F.sum(F.when(F.col("x.overlap"), F.col("n"))).alias("overlaps"),
                    F.sum(F.when(F.col("x.overlap"),
                                 (F.least(F.col("x.end"), F.col("x.pm.end")) - F.col("x.start"))
                                 .cast("decimal(20,0)"))).alias("reissued"),
                    F.sum(F.when(F.col("x.gap").isNotNull(), F.col("n"))).alias("gaps"),
                    F.sum(F.col("x.gap").cast("decimal(20,0)")).alias("wasted"))
               .collect())
        by_kind: dict[str, dict] = {}
        id_space: dict[str, dict] = {}
        issued = ids = refused = acks = disagree = overlaps = reissued = gaps = wasted = 0
        for r in tot:
            src = self.sources[r["src"]]
            if r["status"] == ISSUED:
                k = by_kind.setdefault(KIND_NAMES[r["kind"]], {"blocks": 0, "ids": 0})
                k["blocks"] += r["n"]
                k["ids"] += int(r["ids"])
                issued += r["n"]
                ids += int(r["ids"])
                overlaps += r["overlaps"] or 0
                reissued += int(r["reissued"] or 0)
                gaps += r["gaps"] or 0
                wasted += int(r["wasted"] or 0)
                s = id_space.setdefault(src, {"blocks": 0, "ids_issued": 0, "first_id": None, "next_id": None,
                                              "gaps": 0, "wasted_ids": 0})
                s["blocks"] += r["n"]
                s["ids_issued"] += int(r["ids"])
                s["first_id"] = r["min_start"] if s["first_id"] is None else min(s["first_id"], r["min_start"])
                s["next_id"] = r["max_end"] if s["next_id"] is None else max(s["next_id"], r["max_end"])
                s["gaps"] += r["gaps"] or 0
                s["wasted_ids"] += int(r["wasted"] or 0)
            elif r["status"] == REFUSED:
                refused += r["n"]
            elif r["status"] == ACK:
                acks += r["n"]
            else:
                disagree += r["n"]

        def examples(cond, limit):
            rows = (R.filter(cond).select("src", "kind", "broker_id", "broker_epoch", "status", "x", "n")
                    .orderBy("src", "x.start", "x.end", "kind", "x.ref", "x.pos").limit(limit).collect())
            return rows

        ov_ex = []
        if overlaps:
            for r in examples(F.col("x.overlap"), n_ex):
                x, pm = r["x"], r["x"]["pm"]
                ov_ex.append({"source": self.sources[r["src"]],
                              "block": self._describe(r["kind"], x["start"], x["end"], r["broker_id"],
                                                      r["broker_epoch"], x["ref"], x["pos"]),
                              "overlaps": self._partner(pm),
                              "shared_ids": min(x["end"], pm["end"]) - x["start"],
                              "copies": r["n"]})
            self._resolve_carried(ov_ex)
            self._enrich_chaos(ov_ex)
        gap_ex = []
        if gaps:
            for r in examples(F.col("x.gap").isNotNull(), n_ex):
                x, pm = r["x"], r["x"]["pm"]
                gap_ex.append({"source": self.sources[r["src"]], "from": pm["end"], "to": x["start"],
                               "wasted_ids": x["gap"],
                               "after": self._partner(pm),
                               "before": self._describe(r["kind"], x["start"], x["end"], r["broker_id"],
                                                        r["broker_epoch"], x["ref"], x["pos"])})
            self._resolve_carried(gap_ex)
            self._enrich_chaos(gap_ex)
        dis_ex = []
        if disagree:
            for r in examples(F.col("status") == DISAGREE, n_ex):
                x = r["x"]
                dis_ex.append({"source": self.sources[r["src"]], "raft_index": x["ref"], "position": x["pos"],
                               "block": self._describe(r["kind"], x["start"], x["end"], r["broker_id"],
                                                       r["broker_epoch"], x["ref"], x["pos"])})
            self._disagreement_nodes(dis_ex)
        return {"blocks": {"issued": issued, "ids_issued": ids, "by_kind": by_kind, "refused_records": refused,
                           "chaos_acks_matched": acks},
                "checks": {"overlaps": {"count": overlaps, "ids_reissued": reissued, "examples": ov_ex},
                           "node_disagreements": {"count": disagree, "examples": dis_ex}},
                "gaps": {"count": gaps, "wasted_ids": wasted, "examples": gap_ex},
                "id_space": id_space}

    def _partner(self, pm) -> dict:
        if -pm["nkind"] == CARRIED:
            return {"kind": "carried", "end": pm["end"]}
        return self._describe(-pm["nkind"], pm["start"], pm["end"], pm["broker_id"], pm["broker_epoch"], pm["ref"],
                              pm["pos"])

    def _resolve_carried(self, examples: list[dict]) -> None:
        """Name the blocks examples know only by their end (carried in from an earlier bucket): the
        accepted block of that source with that end (lowest kind, then Raft index, if several)."""
        want = {(e["source"], b["end"]) for e in examples for b in e.values()
                if isinstance(b, dict) and b.get("kind") == "carried"}
        if not want:
            return
        cond = None
        for src, end in want:
            c = (F.col("source") == src) & (F.col("end") == end)
            cond = c if cond is None else cond | c
        found: dict[tuple[str, int], dict] = {}
        for r in (self._blocks().filter(F.col("accepted") & cond)
                  .groupBy("source", "end").agg(F.min(F.struct("kind", "ref", "pos", "start", "broker_id",
                                                                 "broker_epoch")).alias("b")).collect()):
            b = r["b"]
            found[(r["source"], r["end"])] = self._describe(b["kind"], b["start"], r["end"], b["broker_id"],
                                                            b["broker_epoch"], b["ref"], b["pos"])
        for e in examples:
            for k, b in list(e.items()):
                if isinstance(b, dict) and b.get("kind") == "carried":
                    e[k] = found.get((e["source"], b["end"]), {"kind": "unknown", "end": b["end"]})

    def _enrich_chaos(self, examples: list[dict]) -> None:
        """Add process names to chaos blocks named in examples (a filter on the few op indexes)."""
        want = {(e["source"], b["op_index"]) for e in examples for b in e.values()
                if isinstance(b, dict) and b.get("kind") == "chaos"}
        if not want:
            return
        c = self.df["chaos_allocate"]
        rows = (c.filter(F.col("index").cast("bigint").isin(sorted({i for _, i in want})))
                .select("source", F.col("index").cast("bigint").alias("index"), "process").collect())
        names = {(r["source"], r["index"]): r["process"] for r in rows}
        for e in examples:
            for b in e.values():
                if isinstance(b, dict) and b.get("kind") == "chaos":
                    b["process"] = names.get((e["source"], b["op_index"]))

    def _disagreement_nodes(self, examples: list[dict]) -> None:
        a = self.df["alloc"]
        keys = sorted({e["raft_index"] for e in examples})
        rows = (a.filter(F.col("raft_index").isin(keys))
                .select("source", "raft_index", "position", "node_id", "accepted", "error").collect())
        for e in examples:
            e["nodes"] = sorted(({"node_id": r["node_id"], "accepted": r["accepted"], "error": r["error"]}
                                 for r in rows if (r["source"], r["raft_index"], r["position"])
                                 == (e["source"], e["raft_index"], e["position"])), key=lambda d: d["node_id"])

    # ------------------------------------------------------------ migration boundary
    def _boundary(self) -> dict:
        """Every quorum block against ZooKeeper's range (0..zk_block_end: ZooKeeper issues from 0 up).

        A block issued after a seed must start above the block_end of the latest seed before it; a block
        issued before the first seed must start above the first seed's block_end (else the quorum was not
        fresh when it was seeded, and ZooKeeper may have issued the same IDs).  The state machine refuses
        such a seed (``quorum.managers.seed_overlap``); this finds it in a history written without that
        rule.  ``checked`` keeps, per seed, the first quorum block after it."""
        if not self.t["seed"].rows:
            return {"count": 0, "seeds": 0, "examples": [], "checked": []}
        seeds = (self.df["seed"].filter("accepted")
                 .select("source", "raft_index", "position", "next_producer_id", "origin", "zk_broker",
                         "zk_block_start", "zk_block_end", "timestamp_ms")
                 .dropDuplicates(["source", "raft_index", "position"]).collect())
        if not seeds:
            return {"count": 0, "seeds": 0, "examples": [], "checked": []}
        seeds.sort(key=lambda r: (r["source"], r["raft_index"], r["position"]))
        sdf = self.spark.createDataFrame(
            [(i, s["source"], s["raft_index"], s["position"]) for i, s in enumerate(seeds)],
            "seed int, s_source string, s_ref bigint, s_pos int")
        a = self.df["alloc"].filter("accepted")
        j = a.join(F.broadcast(sdf), (a["source"] == sdf["s_source"]) & (
            (a["raft_index"] > sdf["s_ref"]) | ((a["raft_index"] == sdf["s_ref"]) & (a["position"] > sdf["s_pos"]))))
        first = {r["seed"]: r["f"] for r in j.groupBy("seed").agg(F.min(F.struct(
            "raft_index", "position", "producer_id_start", "producer_id_len", "broker_id", "broker_epoch",
            "timestamp_ms")).alias("f")).collect()}
        checked = []
        for i, s in enumerate(seeds):
            f = first.get(i)
            e = self._seed_summary(s)
            if f is None:
                e.update(first_block=None, ok=True, note="no quorum block after this seed")
            else:
                e["first_block"] = self._describe(QUORUM, f["producer_id_start"],
                                                  f["producer_id_start"] + f["producer_id_len"], f["broker_id"],
                                                  f["broker_epoch"], f["raft_index"], f["position"])
                e["ok"] = f["producer_id_start"] > s["zk_block_end"]
            checked.append(e)
        count, bad = self._blocks_in_zookeeper_range(a, seeds)
        for e in checked:
            e["ok"] = e["ok"] and not any(b["seed_raft_index"] == e["seed_raft_index"] and b["source"] == e["source"]
                                          for b in bad)
        return {"count": count, "seeds": len(seeds), "examples": bad, "checked": checked[:self.o.examples]}

    @staticmethod
    def _seed_summary(s) -> dict[str, Any]:
        return {"source": s["source"], "seed_raft_index": s["raft_index"], "origin": s["origin"],
                "zk_broker": s["zk_broker"], "zk_block_start": s["zk_block_start"],
                "zk_block_end": s["zk_block_end"], "next_producer_id": s["next_producer_id"]}

    def _blocks_in_zookeeper_range(self, alloc, seeds: list) -> tuple[int, list[dict]]:
        """(how many, first examples) of the quorum blocks that start inside ZooKeeper's range.

        Each source's Raft order is cut at its seeds; the stretch before the first seed is checked against
        the first seed, the stretch after each seed against that seed.  The stretches are a handful of rows
        (one more than the seeds), broadcast to a range join."""
        rows, by_source = [], {}
        for i, s in enumerate(seeds):
            by_source.setdefault(s["source"], []).append(i)
        lo_inf, hi_inf = (-1, -1), (LONG_MAX, 0)
        for src, idx in by_source.items():
            for k, i in enumerate(idx):  # stretch after seed i, up to the next seed of the source
                nxt = seeds[idx[k + 1]] if k + 1 < len(idx) else None
                hi = (nxt["raft_index"], nxt["position"]) if nxt is not None else hi_inf
                rows.append((i, src, seeds[i]["raft_index"], seeds[i]["position"], hi[0], hi[1],
                             seeds[i]["zk_block_end"], True))
            first = seeds[idx[0]]  # the stretch before the first seed
            rows.append((idx[0], src, lo_inf[0], lo_inf[1], first["raft_index"], first["position"],
                         first["zk_block_end"], False))
        seg = self.spark.createDataFrame(rows, "seed int, g_source string, lo_ref bigint, lo_pos int, hi_ref bigint, "
                                               "hi_pos int, zk_end bigint, after boolean")
        blocks = alloc.select("source", "raft_index", "position", "producer_id_start", "producer_id_len",
                              "broker_id", "broker_epoch").dropDuplicates(["source", "raft_index", "position"])
        after_lo = (F.col("raft_index") > F.col("lo_ref")) | (
            (F.col("raft_index") == F.col("lo_ref")) & (F.col("position") > F.col("lo_pos")))
        before_hi = (F.col("raft_index") < F.col("hi_ref")) | (
            (F.col("raft_index") == F.col("hi_ref")) & (F.col("position") < F.col("hi_pos")))
        inside = (blocks.join(F.broadcast(seg), (F.col("source") == F.col("g_source")) & after_lo & before_hi)
                  .filter(F.col("producer_id_start") <= F.col("zk_end")))
        count = inside.count()
        bad = []
        for r in inside.orderBy("source", "raft_index", "position").limit(self.o.examples).collect():
            s = seeds[r["seed"]]
            blk = self._describe(QUORUM, r["producer_id_start"], r["producer_id_start"] + r["producer_id_len"],
                                 r["broker_id"], r["broker_epoch"], r["raft_index"], r["position"])
            when = "after" if r["after"] else "before"
            e = self._seed_summary(s)
            e.update(block=blk, first_block=blk, issued=f"{when} the seed", ok=False, note=(
                f"quorum block [{blk['start']}, {blk['end'] - 1}] issued {when} the seed lies in ZooKeeper's "
                f"range 0..{s['zk_block_end']}" + ("" if r["after"] else ": the quorum was not fresh when seeded")))
            bad.append(e)
        return count, bad

    # ------------------------------------------------------------ chaos PIDs
    def _duplicate_pids(self) -> dict:
        t = self.t["chaos_generate"]
        if not t.rows:
            return {"count": 0, "pids_checked": 0, "extra_issues": 0, "examples": []}
        g = self.df["chaos_generate"].select("source", F.col("pid").cast("bigint").alias("pid"),
                                             F.struct(F.col("index").cast("bigint").alias("index"), "process")
                                             .alias("op"))
        d = (g.groupBy("source", "pid").agg(F.count(F.lit(1)).alias("n"), F.min("op").alias("first"),
                                            F.max("op").alias("last"))
             .filter("n > 1").persist())
        try:
            s = d.agg(F.count(F.lit(1)).alias("c"), F.sum(F.col("n") - 1).alias("extra")).collect()[0]
            ex = d.orderBy("source", "pid").limit(self.o.examples).collect() if s["c"] else []
        finally:
            d.unpersist()
        return {"count": s["c"], "pids_checked": t.rows, "extra_issues": int(s["extra"] or 0),
                "examples": [{"source": r["source"], "pid": r["pid"], "times": r["n"],
                              "first": {"op_index": r["first"]["index"], "process": r["first"]["process"]},
                              "last": {"op_index": r["last"]["index"], "process": r["last"]["process"]}}
                             for r in ex]}

    # ------------------------------------------------------------ brokers
    def _brokers(self, R) -> tuple[dict, dict, dict]:
        timed = None if R is None else R.filter(
            (F.col("kind") == QUORUM) & (F.col("status") == ISSUED) & F.col("win").isNotNull())
        return broker_rates(timed, self.df["register"] if self.t["register"].rows else None, self.sources, self.o)
