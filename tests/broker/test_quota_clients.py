"""KIP-936 end to end: quotas set with pidctl, committed by a real quorum, polled by a real broker
process, enforced on Produce from raw requests and from unmodified clients.

What the clients do with a refused batch (THROTTLING_QUOTA_EXCEEDED plus throttle_time_ms):
kafka-python 3.0 treats the error as retriable and pauses the connection for the throttle time
(client-side throttling, KIP-219), so it backs off and delivers.  librdkafka 2.16 reports the
throttle time only (throttle_cb, stats) and treats the error on Produce as permanent: the
message fails with THROTTLING_QUOTA_EXCEEDED.  Either way the broker also mutes the connection
for the throttle time, as Kafka does, so a client that ignores it gains nothing.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import threading
import time

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, Producer
from kafka import KafkaProducer
from kio.index import load_request_schema

from broker.quota import read_stats
from broker.recordbatch import encode_batch
from cli.main import cli
from quorum.client import api as p
from quorum.client.quorum import Connection
from tests.conftest import wait_for
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE, INIT_PRODUCER_ID, LIST_OFFSETS = 0, 22, 2
QUOTA_ARGS = ("--producer-id-quota-window-num", "2", "--producer-id-quota-window-size-s", "1",
              "--quota-refresh-s", "0.2")


def pidctl(cluster, *args: str):
    res = CliRunner().invoke(cli, ["--quorum", ",".join(cluster.lc.client_addresses()), *args])
    return res.exit_code, res.output


def quota_in_force(broker, principal_user: str | None, rate: float):
    def check():
        try:
            cfg = read_stats(broker.data_dir)["config"]
        except (OSError, ValueError):
            return False
        return (cfg["default"] if principal_user is None else cfg["users"].get(principal_user)) == rate
    wait_for(check, 15, what=f"the broker to apply producer_ids_rate={rate}")


def stats(broker, principal: str) -> dict:
    return read_stats(broker.data_dir)["principals"].get(principal, {})


# ------------------------------------------------------------------ raw protocol
def _entity(cls_name: str, version: int = 9, **fields):
    mod = __import__(load_request_schema(PRODUCE, version).__module__, fromlist=[cls_name])
    return getattr(mod, cls_name)(**fields)


def produce_request(pid: int, topic: str = "q", seq: int = 0):
    records = encode_batch([(None, f"m{pid}-{seq}".encode())], producer_id=pid, producer_epoch=0, base_sequence=seq)
    pd = _entity("PartitionProduceData", index=0, records=records)
    td = _entity("TopicProduceData", name=topic, partition_data=(pd,))
    return kafka.request_entity(PRODUCE, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                            topic_data=(td,))


def test_pidctl_quota_and_raw_produce_over_the_quota(cluster, brokers):
    # Bad input: one clear line, nothing committed.
    for args, fragment in ((["--default", "--producer-ids-rate", "-1"], "is not in (0,"),
                           (["--default", "--producer-ids-rate", "inf"], "must be finite"),
                           (["--default", "--producer-ids-rate", "nan"], "must be finite"),
                           (["--user", "Group:ops", "--producer-ids-rate", "1"], "unknown principal type"),
                           (["--user", "a b", "--producer-ids-rate", "1"], "bad user name"),
                           (["--user", "a", "--default", "--producer-ids-rate", "1"], "exactly one of"),
                           (["--producer-ids-rate", "1"], "exactly one of")):
        code, out = pidctl(cluster, "quota", "set", *args)
        assert code == 2 and fragment in out and "Traceback" not in out, (args, out)
    assert json.loads(pidctl(cluster, "quota", "list", "-o", "json")[1]) == []

    code, out = pidctl(cluster, "quota", "set", "--default", "--producer-ids-rate", "1", "-o", "json")
    assert code == 0 and json.loads(out)["changed"] is True
    code, out = pidctl(cluster, "quota", "set", "--user", "alice", "--producer-ids-rate", "50")
    assert code == 0 and "set producer_ids_rate=50 for User:alice" in out
    assert json.loads(pidctl(cluster, "quota", "list", "-o", "json")[1]) == [
        {"user": None, "entity": "<default>", "producer_ids_rate": 1.0},
        {"user": "alice", "entity": "User:alice", "producer_ids_rate": 50.0}]

    b = brokers(1, *QUOTA_ARGS)
    quota_in_force(b, None, 1.0)

    async def go():
        conn = Connection(b.bootstrap, "quota-test")
        try:
            pids = []
            for _ in range(4):
                r = await conn.call(kafka.request_entity(INIT_PRODUCER_ID, 4, transactional_id=None,
                                                     transaction_timeout=datetime.timedelta(seconds=60),
                                                     producer_id=-1, producer_epoch=-1), 10)
                pids.append(int(r.producer_id))
            out = []
            for pid in pids[:3]:  # burst = 1/s * min(60 s, 2 windows * 1 s) = 2: the third is over the quota
                r = await conn.call(produce_request(pid), 10)
                out.append((Errors(int(r.responses[0].partition_responses[0].error_code)),
                            int(r.throttle_time.total_seconds() * 1000),
                            r.responses[0].partition_responses[0].error_message))
            # The connection is muted for the throttle time: the next request waits, then a PID
            # already seen passes however empty the bucket is.
            t0 = time.monotonic()
            r = await conn.call(produce_request(pids[0], seq=1), 10)
            muted_s = time.monotonic() - t0
            again = (Errors(int(r.responses[0].partition_responses[0].error_code)),
                     int(r.throttle_time.total_seconds() * 1000))
            # After the throttle time the refused PID gets its token.
            r = await conn.call(produce_request(pids[2]), 10)
            retried = Errors(int(r.responses[0].partition_responses[0].error_code))
            return out, muted_s, again, retried
        finally:
            conn.close()

    out, muted_s, again, retried = asyncio.run(go())
    assert out[0][:2] == (Errors.NONE, 0) and out[1][:2] == (Errors.NONE, 0)
    code, throttle_ms, message = out[2]
    assert code == Errors.THROTTLING_QUOTA_EXCEEDED and 1 <= throttle_ms <= 1000
    assert "User:ANONYMOUS is over its producer_ids_rate" in message
    assert muted_s >= (throttle_ms - 100) / 1000
    assert again == (Errors.NONE, 0)
    assert retried == Errors.NONE

    def counted():
        s = stats(b, "User:ANONYMOUS")
        return s if s.get("new_pids") == 3 else None
    s = wait_for(counted, 10, what="the stats file to show the admissions")
    assert s["throttled_requests"] == 1 and s["seen_pids"] >= 1 and s["quota_source"] == "default"
    assert s["filter_bytes"] > 0

    # The refused batch was not appended: 3 batches of one record each are in the log.
    async def end_offset():
        conn = Connection(b.bootstrap, "quota-test")
        try:
            mod = __import__(load_request_schema(LIST_OFFSETS, 7).__module__, fromlist=["ListOffsetsTopic"])
            topic = mod.ListOffsetsTopic(name="q", partitions=(mod.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1),))
            r = await conn.call(kafka.request_entity(LIST_OFFSETS, 7, replica_id=-1, isolation_level=0,
                                                 topics=(topic,)), 10)
            return int(r.topics[0].partitions[0].offset)
        finally:
            conn.close()
    assert asyncio.run(end_offset()) == 4  # pids[0] twice, pids[1], pids[2] once (after its refusal)

    code, out = pidctl(cluster, "quota", "status", "--broker-dir", b.data_dir, "-o", "json")
    assert code == 0 and json.loads(out)[b.data_dir]["principals"]["User:ANONYMOUS"]["throttled_requests"] == 1
    code, out = pidctl(cluster, "quota", "status", "--broker-dir", b.data_dir)
    assert code == 0 and "User:ANONYMOUS" in out
    code, out = pidctl(cluster, "quota", "status", "--broker-dir", os.path.join(b.dir, "nope"))
    assert code == 1 and "no quota stats" in out

    # Lifting the default: the broker stops tracking ANONYMOUS within a refresh.
    code, out = pidctl(cluster, "quota", "delete", "--default")
    assert code == 0 and "removed producer_ids_rate of <default>" in out
    wait_for(lambda: "User:ANONYMOUS" not in read_stats(b.data_dir)["principals"], 15,
             what="the broker to forget the lifted quota")


# ------------------------------------------------------------------ real clients
class GoodProducer(threading.Thread):
    """One librdkafka producer, one PID, producing a message every 20 ms until stopped."""

    def __init__(self, bootstrap: str, topic: str, **config):
        super().__init__(daemon=True)
        self.throttles: list[int] = []
        self.errors: list = []
        self.delivered = 0
        self.stop = threading.Event()
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                                  "message.timeout.ms": 60_000, "log_level": 3,
                                  "throttle_cb": lambda ev: self.throttles.append(ev.throttle_time), **config})
        self.topic = topic
        self.first = threading.Event()

    def _report(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered += 1
            self.first.set()

    def run(self):
        i = 0
        while not self.stop.is_set():
            self.producer.produce(self.topic, value=f"good-{i}", on_delivery=self._report)
            self.producer.poll(0.02)
            i += 1
        self.sent = i
        self.left = self.producer.flush(30)


def rogue_confluent(bootstrap: str, topic: str, n: int, **config) -> tuple[list, float]:
    """A new librdkafka producer (a new PID) for every message, all at once; the delivery result of
    each and the seconds it all took."""
    t0 = time.monotonic()
    results: list = [None] * n
    producers = [Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "message.timeout.ms": 20_000, "log_level": 0, **config}) for _ in range(n)]

    def report(i):
        return lambda err, msg: results.__setitem__(i, err)
    for i, prod in enumerate(producers):
        prod.produce(topic, value=f"rogue-{i}", on_delivery=report(i))
    for prod in producers:
        assert prod.flush(30) == 0
    return results, time.monotonic() - t0


def rogue_kafka_python(bootstrap: str, topic: str, n: int, **config) -> list[float]:
    """``n`` new kafka-python producers (new PIDs) sending one message each at the same moment; the
    seconds each send took to be acknowledged.  With at most the burst (2) in the bucket, the others
    must wait for tokens: a client that did not back off and retry would fail instead."""
    producers = [KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", retries=1000,
                               request_timeout_ms=10_000, delivery_timeout_ms=30_000, **config) for _ in range(n)]
    try:
        t0 = time.monotonic()
        futures = [prod.send(topic, value=f"rogue-py-{i}".encode()) for i, prod in enumerate(producers)]
        took = []
        for f in futures:
            f.get(timeout=30)
            took.append(time.monotonic() - t0)
        return took
    finally:
        for prod in producers:
            prod.close(timeout=5)


def run_rogue_and_good(bootstrap: str, good_config: dict, rogue_config: dict, rogue_py_config: dict):
    good = GoodProducer(bootstrap, "good", **good_config)
    good.start()
    assert good.first.wait(30), "the well-behaved producer never got a message through"
    rogue = rogue_confluent(bootstrap, "rogue", 12, **rogue_config)
    rogue_py = rogue_kafka_python(bootstrap, "rogue", 4, **rogue_py_config)
    good.stop.set()
    good.join(60)
    good.producer = None  # destroyed now, not after the broker stopped (it would log reconnect failures)
    return good, rogue, rogue_py


def assert_good_never_throttled(good: GoodProducer) -> None:
    assert good.errors == [] and good.left == 0 and good.delivered == good.sent > 20
    assert [t for t in good.throttles if t > 0] == []


def assert_rogue_throttled(rogue: tuple[list, float], rogue_py: list[float], rate: float = 1.0, burst: float = 2):
    results, took = rogue
    refused = [e for e in results if e is not None]
    assert refused and all(e.code() == KafkaError.THROTTLING_QUOTA_EXCEEDED for e in refused), results
    # The quota's promise: no more new PIDs than the burst plus the rate over the time it took.
    assert 1 <= len(results) - len(refused) <= burst + rate * took + 1
    # kafka-python backs off for the throttle time and then delivers every message: 4 new PIDs at
    # once with at most 2 tokens in the bucket, so the last waited for a token (1 s at 1/s).
    assert len(rogue_py) == 4 and max(rogue_py) >= 0.9


def test_anonymous_rogue_is_throttled_a_producer_reusing_its_pid_is_not(cluster, brokers):
    """No SASL: the --default quota applies to User:ANONYMOUS.  Both clients share the principal and
    its bucket; the one reusing its producer ID never costs quota after its first batch."""
    assert pidctl(cluster, "quota", "set", "--default", "--producer-ids-rate", "1")[0] == 0
    b = brokers(1, *QUOTA_ARGS)
    quota_in_force(b, None, 1.0)
    good, rogue, rogue_py = run_rogue_and_good(b.bootstrap, {}, {}, {})
    assert_good_never_throttled(good)
    assert_rogue_throttled(rogue, rogue_py)
    s = read_stats(b.data_dir)["principals"]["User:ANONYMOUS"]
    assert s["throttled_requests"] >= len([e for e in rogue[0] if e is not None])
    assert s["seen_pids"] >= good.sent // 10  # the good producer's batches: its PID seen, free


def test_two_principals_rogue_is_throttled_well_behaved_is_not(cluster, brokers, tmp_path):
    """With SASL (quorum/security/ package): per-principal quotas, same rate for both users."""
    credentials = pytest.importorskip("quorum.security.credentials")
    creds = str(tmp_path / "users")
    credentials.add_user(creds, "rogue", "rogue-secret")
    credentials.add_user(creds, "good", "good-secret")
    assert pidctl(cluster, "quota", "set", "--user", "rogue", "--producer-ids-rate", "1")[0] == 0
    assert pidctl(cluster, "quota", "set", "--user", "good", "--producer-ids-rate", "1")[0] == 0
    for user in ("rogue", "good"):  # with SASL on, the broker enforces the ACLs: idempotent producers need these
        assert pidctl(cluster, "acl", "add", "--principal", f"User:{user}", "--operation", "IDEMPOTENT_WRITE",
                      "--cluster")[0] == 0
        assert pidctl(cluster, "acl", "add", "--principal", f"User:{user}", "--operation", "WRITE",
                      "--topic", "*")[0] == 0
    b = brokers(1, *QUOTA_ARGS, "--sasl-credentials-file", creds)
    quota_in_force(b, "good", 1.0)

    def sasl(user):
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
                "sasl.password": f"{user}-secret"}
    py = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": "rogue",
          "sasl_plain_password": "rogue-secret"}
    good, rogue, rogue_py = run_rogue_and_good(b.bootstrap, sasl("good"), sasl("rogue"), py)
    assert_good_never_throttled(good)
    assert_rogue_throttled(rogue, rogue_py)
    principals = read_stats(b.data_dir)["principals"]
    assert principals["User:good"]["throttled_requests"] == 0 and principals["User:good"]["new_pids"] == 1
    assert principals["User:rogue"]["throttled_requests"] > 0
