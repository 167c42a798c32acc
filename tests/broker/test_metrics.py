"""Broker metrics: the quota and prefetch figures as units, then a running quorum plus a broker whose
endpoints are scraped before and after allocations (and whose JSON logs are parsed line by line)."""
from __future__ import annotations

import asyncio
import datetime
import json
import time

import pytest
from click.testing import CliRunner
from kio.index import load_request_schema

from benchmarks.processes import BrokerProcess
from broker.metrics import BROKER_METRICS, broker_families, quota_families
from broker.pid_manager import PidManagerConfig, ProducerIdManager
from broker.recordbatch import encode_batch
from cli.main import cli
from quorum.client import api as p
from quorum.client.quorum import Connection
from quorum.localcluster import LocalCluster, free_ports
from quorum.producer_ids import TokenBucket
from quorum.telemetry.metrics import make_registry, read_metrics
from tests.broker.test_pid_manager import FakeQuorum, settle
from tests.conftest import wait_for
from tests.support.metrics import samples
from records.wire import kafka
from records.wire.errors import CoordinatorLoadInProgressError, Errors

INIT_PRODUCER_ID, PRODUCE = 22, 0


class PrincipalQuotas:
    """A small real quota provider: a token bucket per principal, KIP-936's stats() shape."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.buckets: dict[str, TokenBucket] = {}
        self.throttle_ms: dict[str, int] = {}
        self.throttled: dict[str, int] = {}

    def take(self, principal: str) -> int:
        bucket = self.buckets.setdefault(principal, TokenBucket(self.rate, self.burst))
        wait = bucket.take()
        if wait:
            self.throttle_ms[principal] = self.throttle_ms.get(principal, 0) + wait
            self.throttled[principal] = self.throttled.get(principal, 0) + 1
        return wait

    def stats(self) -> dict:
        return {pr: {"rate": self.rate, "tokens": b.tokens, "throttle_time_ms": self.throttle_ms.get(pr, 0),
                     "throttled_requests": self.throttled.get(pr, 0)} for pr, b in self.buckets.items()}


def test_quota_figures_per_principal_come_from_the_provider():
    quotas = PrincipalQuotas(rate=0.001, burst=2)  # no refill within the test: 2 tokens, then throttled
    for _ in range(5):
        quotas.take("User:alice")
    quotas.take("User:bob")
    status = {"broker_id": 1, "listen": "127.0.0.1:9", "counters": {}, "pid_manager": None,
              "quota": quotas.stats()}
    m = samples(make_registry(lambda: status, broker_families))
    alice, bob = (("principal", "User:alice"),), (("principal", "User:bob"),)
    assert m[("pidquorum_broker_quota_throttled_requests_total", alice)] == 3
    assert m[("pidquorum_broker_quota_throttled_requests_total", bob)] == 0
    assert m[("pidquorum_broker_quota_tokens", alice)] == pytest.approx(0, abs=0.01)
    assert m[("pidquorum_broker_quota_tokens", bob)] == pytest.approx(1, abs=0.01)
    assert m[("pidquorum_broker_quota_rate_per_second", alice)] == 0.001
    expected_s = quotas.throttle_ms["User:alice"] / 1000
    assert expected_s > 0 and m[("pidquorum_broker_quota_throttle_time_seconds_total", alice)] == expected_s
    # No provider (the default): the families exist, with no samples.
    assert all(not fam.samples for fam in quota_families({}))


def test_prefetch_hits_and_misses():
    async def go():
        fake = FakeQuorum(block_size=10)
        mgr = ProducerIdManager(1, fake, config=PidManagerConfig.kafka_fixed_threshold(prefetch_threshold=0.5))
        await mgr.start()
        try:
            got = []
            deadline = time.monotonic() + 10
            while len(got) < 35:  # 3 block switches; each finds the next block prefetched or not
                try:
                    got.append(mgr.generate_producer_id())
                except CoordinatorLoadInProgressError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.001)
                else:
                    await settle()  # a steady client: the refill task gets to run
            fake.hang_forever = True  # the quorum stops answering: the next switch finds nothing
            while True:
                try:
                    mgr.generate_producer_id()
                except CoordinatorLoadInProgressError:
                    break
            for _ in range(3):  # a dry spell counts one miss, however many callers are refused
                with pytest.raises(CoordinatorLoadInProgressError):
                    mgr.generate_producer_id()
            return mgr.stats()["counters"]
        finally:
            await mgr.close()

    c = asyncio.run(go())
    assert c["prefetch_hits"] >= 3 and c["prefetch_misses"] == 1
    assert c["load_in_progress"] >= 4


# ------------------------------------------------------------------------- integration
def _init_pid(conn: Connection, tid=None, pid=-1, epoch=-1):
    body = kafka.request_entity(INIT_PRODUCER_ID, 4, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                            transaction_timeout=datetime.timedelta(seconds=60))
    return asyncio.run(_call(conn, body))


async def _call(conn, body):
    return await conn.call(body, 10.0)


def _produce(conn: Connection, records: bytes):
    mod = __import__(load_request_schema(PRODUCE, 9).__module__, fromlist=["x"])
    pd = mod.PartitionProduceData(index=0, records=records)
    td = mod.TopicProduceData(name="metrics", partition_data=(pd,))
    body = kafka.request_entity(PRODUCE, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                            topic_data=(td,))
    r = asyncio.run(_call(conn, body)).responses[0].partition_responses[0]
    return Errors(int(r.error_code))


@pytest.fixture
def metered(tmp_path, request):
    """A three-node quorum (metrics on, JSON logs) and one broker (metrics on, JSON logs)."""
    lc = LocalCluster(str(tmp_path / "cluster"))
    lc.up(3, block_size=10, metrics=True, log_format="json")
    broker_metrics = free_ports(1)[0]
    b = BrokerProcess(str(tmp_path), 5, lc.client_addresses(), "--metrics-port", str(broker_metrics),
                      "--log-format", "json")
    try:
        b.start()
        yield lc, b, f"127.0.0.1:{broker_metrics}"
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"----- broker log -----\n{b.tail()}")
            for n in lc.nodes():
                print(f"----- node {n.node_id} log -----\n{lc.tail_log(n.node_id, 40)}")
        b.stop()
        lc.down(timeout=5)


def _node_scrapes(lc: LocalCluster) -> dict[int, dict]:
    return {n.node_id: read_metrics(n.metrics_address) for n in lc.nodes()}


def test_scraped_counters_move_after_allocations_and_pidctl_reads_the_same(metered):
    lc, b, broker_endpoint = metered
    # The broker's first block (it serves once it holds one), applied on every node.
    nodes0 = wait_for(lambda: (lambda s: s if all(m.get("pidquorum_allocations_total", {}).get("5") for m in s.values())
                               else None)(_node_scrapes(lc)), 10, what="every node to apply the first block")
    broker0 = read_metrics(broker_endpoint)
    labelled = {"pidquorum_broker", "pidquorum_broker_pid_fetch_errors", "pidquorum_broker_transactions",
                "pidquorum_broker_txn_step_seconds"} | {n for n in BROKER_METRICS if "_quota_" in n}
    assert set(BROKER_METRICS) - labelled <= {k.removesuffix("_total") for k in broker0}  # no quota provider yet
    assert broker0["pidquorum_broker_epoch"] >= 1

    conn = Connection(b.bootstrap, "metrics-test")
    try:
        pids, load_in_progress = [], 0
        deadline = time.monotonic() + 20
        while len(pids) < 45:  # block size 10: several block switches
            r = _init_pid(conn)
            if Errors(int(r.error_code)) == Errors.COORDINATOR_LOAD_IN_PROGRESS:  # retried, as clients do
                load_in_progress += 1
                assert time.monotonic() < deadline
                time.sleep(0.005)
                continue
            assert Errors(int(r.error_code)) == Errors.NONE
            pids.append(int(r.producer_id))
        assert len(set(pids)) == 45 and min(pids) >= 0
        bad = _init_pid(conn, tid="")  # a bad request: answered, and logged with its correlation id
        assert Errors(int(bad.error_code)) == Errors.INVALID_REQUEST
        first = _init_pid(conn, tid="t-metrics")
        _init_pid(conn, tid="t-metrics")  # epoch bump: the first instance is fenced
        fenced = _init_pid(conn, tid="t-metrics", pid=int(first.producer_id), epoch=int(first.producer_epoch))
        assert Errors(int(fenced.error_code)) in (Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH)
        batch = encode_batch([(None, b"v")], producer_id=pids[0], producer_epoch=0, base_sequence=0)
        assert _produce(conn, batch) == Errors.NONE
        assert _produce(conn, batch) == Errors.NONE  # the retry of an appended batch: a duplicate
    finally:
        conn.close()

    broker1 = read_metrics(broker_endpoint)
    assert broker1["pidquorum_broker_pids_issued_total"] - broker0["pidquorum_broker_pids_issued_total"] == 45
    hits = broker1["pidquorum_broker_prefetch_hits_total"] - broker0["pidquorum_broker_prefetch_hits_total"]
    assert broker1["pidquorum_broker_coordinator_load_in_progress_total"] \
        == broker0["pidquorum_broker_coordinator_load_in_progress_total"] + load_in_progress
    misses = broker1["pidquorum_broker_prefetch_misses_total"] - broker0["pidquorum_broker_prefetch_misses_total"]
    assert (misses > 0) == (load_in_progress > 0) and misses <= load_in_progress
    assert hits + misses >= 4, (hits, misses, pids[:3], pids[-3:], broker0.get("pidquorum_broker_pid_reserve_ids"))  # 45 IDs from blocks of 10: each switch found a prefetched block, or none
    assert broker1["pidquorum_broker_duplicates_total"] == broker0["pidquorum_broker_duplicates_total"] + 1
    assert broker1["pidquorum_broker_fenced_producers_total"] == broker0["pidquorum_broker_fenced_producers_total"] + 1
    assert broker1["pidquorum_broker_requests_total"] >= broker0["pidquorum_broker_requests_total"] + 50
    assert broker1["pidquorum_broker_pid_blocks_fetched_total"] >= broker0["pidquorum_broker_pid_blocks_fetched_total"] + 4

    # Every node applied the broker's new blocks; the commit index moved; the leader timed its answers.
    fetched = broker1["pidquorum_broker_pid_blocks_fetched_total"]

    def caught_up():
        scrapes = _node_scrapes(lc)
        return scrapes if all(m.get("pidquorum_allocations_total", {}).get("5", 0) >= fetched for m in scrapes.values()) \
            else None
    nodes1 = wait_for(caught_up, 10, what="every node to apply the broker's blocks")
    for i, m in nodes1.items():
        assert m["pidquorum_raft_commit_index"] > nodes0[i]["pidquorum_raft_commit_index"]
        # Blocks of 10, and the single IDs the quorum took for the transactional id (same broker).
        ids, blocks = m["pidquorum_allocated_ids_total"]["5"], m["pidquorum_allocations_total"]["5"]
        assert ids > nodes0[i]["pidquorum_allocated_ids_total"]["5"] and blocks < ids <= 10 * blocks
        assert m["pidquorum_journal_syncs_total"] > nodes0[i]["pidquorum_journal_syncs_total"]
    answered = lambda s: sum(m["pidquorum_allocation_latency_seconds_count"] for m in s.values())  # noqa: E731
    assert answered(nodes1) >= answered(nodes0) + 4
    leaders = [i for i, m in nodes1.items() if m["pidquorum_raft_state"]["leader"] == 1]
    assert len(leaders) == 1
    assert set(nodes1[leaders[0]]["pidquorum_raft_follower_lag_entries"]) == {
        n.raft_address for n in lc.nodes() if n.node_id != leaders[0]}

    # pidctl reads the same figures (the cluster is idle now: nothing moves between the reads).
    runner = CliRunner()
    res = runner.invoke(cli, ["broker", "status", "--metrics", broker_endpoint, "-o", "json"])
    assert res.exit_code == 0, res.output
    shown, again = json.loads(res.output)["metrics"], read_metrics(broker_endpoint)
    for name in ("pids_issued", "prefetch_hits", "prefetch_misses", "coordinator_load_in_progress", "duplicates",
                 "fenced_producers"):
        assert shown[f"pidquorum_broker_{name}_total"] == again[f"pidquorum_broker_{name}_total"] \
            == broker1[f"pidquorum_broker_{name}_total"]
    blocks = "pidquorum_broker_pid_blocks_fetched_total"  # the refill task may still be filling the reserve
    assert broker1[blocks] <= shown[blocks] <= again[blocks]

    # The quorum, idle once the broker is gone (no more refills) and every node has applied everything.
    b.stop()

    def settled():
        s = _node_scrapes(lc)
        commits = {m["pidquorum_raft_commit_index"] for m in s.values()}
        return len(commits) == 1 and all(m["pidquorum_raft_apply_lag_entries"] == 0 for m in s.values()) \
            and all(v == 0 for m in s.values() for v in m.get("pidquorum_raft_follower_lag_entries", {}).values())
    wait_for(settled, 10, what="the quorum to settle")
    res = runner.invoke(cli, ["--quorum", ",".join(lc.client_addresses()), "quorum", "status", "-o", "json"])
    assert res.exit_code == 0, res.output
    status = {n["node_id"]: n for n in json.loads(res.output)}
    scrapes = _node_scrapes(lc)
    for i, m in scrapes.items():
        st = status[i]
        assert m["pidquorum_raft_term"] == st["raft"]["term"]
        assert m["pidquorum_raft_commit_index"] == st["raft"]["commit_index"]
        assert m["pidquorum_allocations_total"] == {k: v["blocks"] for k, v in st["allocations"].items()}
        assert m["pidquorum_snapshot_size_bytes"] == st["snapshot"]["bytes"]
        assert m["pidquorum_raft_leader_changes_total"] == st["raft"]["leader_changes"]
        lag = {peer: v["lag_entries"] for peer, v in st["raft"]["peers"].items() if v["lag_entries"] is not None}
        assert m.get("pidquorum_raft_follower_lag_entries", {}) == lag
        sync = st["raft"]["journal_sync_latency"]
        # Read before the scrape: the scrape saw at least as many syncs.
        assert m["pidquorum_journal_sync_latency_seconds_count"] >= sync["count"] > 0
    res = runner.invoke(cli, ["--quorum", ",".join(lc.client_addresses()), "quorum", "status"])
    assert res.exit_code == 0 and "figures (as on the metrics endpoints)" in res.output

    # The logs: every line of every process is one JSON object with the process identity.
    lc.down(timeout=5)
    request_lines = 0
    for path, ident in [(b.log_path, "broker_id")] + [(lc.log_path(n.node_id), "node_id") for n in lc.nodes()]:
        with open(path) as f:
            text = f.read()
        assert text.strip(), path
        raft_up = False  # the term is known from the Raft start on (the identity check logs before it)
        for raw in text.splitlines():
            line = json.loads(raw)  # fails on any non-JSON line
            assert {"ts", "level", "logger", "msg", ident} <= set(line), (path, line)
            raft_up = raft_up or "term" in line
            if ident == "node_id" and raft_up:
                assert "term" in line, line
            request_lines += "correlation_id" in line
    assert request_lines >= 1


def test_pidctl_broker_status_of_nothing_is_a_clear_error():
    res = CliRunner().invoke(cli, ["--timeout", "2", "broker", "status", "--metrics", f"127.0.0.1:{free_ports(1)[0]}"])
    assert res.exit_code == 3 and "cannot read" in res.output


def test_a_block_arriving_just_as_the_last_one_ran_out_is_a_hit_and_a_dry_spell_is_a_miss():
    """Every block switch counts once: hit (the next block was there in time, even if it arrived after
    the last ID went out but before anyone asked again) or miss (somebody was refused)."""
    mgr = ProducerIdManager(1, FakeQuorum(block_size=10))
    counters = lambda: (mgr.stats()["counters"]["prefetch_hits"], mgr.stats()["counters"]["prefetch_misses"])  # noqa: E731
    mgr._accept(0, 10, 0.001, time.monotonic())  # the first block: no switch
    assert [mgr.generate_producer_id() for _ in range(10)] == list(range(10)) and counters() == (0, 0)
    mgr._accept(10, 10, 0.001, time.monotonic())  # arrives as the first one is spent, nobody waited
    assert [mgr.generate_producer_id() for _ in range(10)] == list(range(10, 20)) and counters() == (1, 0)
    mgr._accept(20, 10, 0.001, time.monotonic())  # queued before the switch: a hit when taken
    assert mgr.generate_producer_id() == 20 and counters() == (2, 0)
    for _ in range(9):
        mgr.generate_producer_id()
    for _ in range(2):
        with pytest.raises(CoordinatorLoadInProgressError):
            mgr.generate_producer_id()
    mgr._accept(30, 10, 0.001, time.monotonic())  # late: the refusal already counted the miss
    assert mgr.generate_producer_id() == 30 and counters() == (2, 1)


def test_transaction_step_times_and_outcomes_are_scraped(metered):
    """Three committed transactions and one aborted one of a real client: the coordinator's step summary counts
    each add and end (with time in them), the completions follow, and the outcomes are counted."""
    from confluent_kafka import Producer
    _, b, endpoint = metered
    producer = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "metrics-tx"})
    producer.init_transactions(30)
    for i in range(4):
        producer.begin_transaction()
        producer.produce("metrics-tx-topic", value=b"v", partition=0)
        if i < 3:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # the partition added, the record written: the abort is the broker's to do
            producer.abort_transaction(30)
    m = wait_for(lambda: (lambda m: m if m.get("pidquorum_broker_transactions_total", {}).get("committed", 0) >= 3
                          and m["pidquorum_broker_transactions_total"].get("aborted", 0) >= 1 else None)(
        read_metrics(endpoint)), 20, what="the completions of the transactions")
    count, total = m["pidquorum_broker_txn_step_seconds_count"], m["pidquorum_broker_txn_step_seconds_sum"]
    assert count["add"] >= 4 and count["end"] == 4 and count["complete"] >= 4
    assert all(total[s] > 0 for s in ("add", "end", "complete"))
    assert m["pidquorum_broker_transactions_total"]["timed_out"] == 0
    assert total["add"] / count["add"] < 5  # seconds: a mean, not a sum of sums
