"""``pidctl txn ...`` as an operator runs it (click's CliRunner), against a real quorum and broker process:
the listing and describing commands, find-hanging finding the transaction a SIGKILLed producer left open,
abort ending it (read_committed readers skip its data, the LSO moves on, the producer is fenced), and a
producer that wakes up after the abort being refused."""
from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from benchmarks.processes import BrokerProcess
from broker.recordbatch import encode_batch
from chaos.txn_read import RawBroker
from quorum.client.broker_admin import BrokerAdmin, BrokerRefused
from cli.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE
from cli.main import cli
from quorum.localcluster import free_ports
from tests.conftest import wait_for
from tests.support.kafka_requests import entity
from records.wire import kafka
from records.wire.errors import Errors

PARTITIONS = 3
PRODUCE, END_TXN = 0, 26


@pytest.fixture
def broker(cluster, tmp_path, request):
    b = BrokerProcess(str(tmp_path / "brokers"), 1, cluster.lc.client_addresses(), "--partitions", str(PARTITIONS))
    b.start()
    yield b
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"----- broker log -----\n{b.tail()}")
    b.stop()


@pytest.fixture
def pidctl(broker):
    runner = CliRunner()

    def invoke(*args, expect=EXIT_OK):  # expect=None: any exit code
        r = runner.invoke(cli, ["--timeout", "15", "txn", *args])
        assert expect is None or r.exit_code == expect, (r.exit_code, r.output, r.exception)
        return r
    return invoke


def txn_producer(bootstrap: str, tid: str, **config) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2, "log_level": 0, **config})
    p.init_transactions(30)
    return p


def read_committed(bootstrap: str, topic: str) -> list[bytes]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      consumer_timeout_ms=1500, isolation_level="read_committed")
    try:
        c.assign([KTopicPartition(topic, i) for i in range(PARTITIONS)])
        c.seek_to_beginning()
        return [m.value for m in c]
    finally:
        c.close()


def offsets(bootstrap: str, topic: str, committed: bool) -> dict[int, int]:
    with RawBroker(bootstrap, timeout=5) as raw:
        return raw.list_offsets(topic, PARTITIONS, committed)


# ------------------------------------------------------------------ list, describe, describe-producers
def test_list_describe_and_describe_producers(broker, pidctl):
    p = txn_producer(broker.bootstrap, "ops-tx", **{"transaction.timeout.ms": 120_000})
    p.begin_transaction()
    p.produce("ops", value=b"a", partition=1)
    assert p.flush(30) == 0

    rows = json.loads(pidctl("list", "--broker", broker.bootstrap, "-o", "json").output)
    assert [(r["transactional_id"], r["state"]) for r in rows] == [("ops-tx", "Ongoing")]
    pid = rows[0]["producer_id"]
    table = pidctl("list", "--broker", broker.bootstrap).output
    assert "ops-tx" in table and "Ongoing" in table and str(pid) in table
    assert json.loads(pidctl("list", "--broker", broker.bootstrap, "--state", "CompleteCommit", "-o", "json").output) == []
    assert json.loads(pidctl("list", "--broker", broker.bootstrap, "--producer-id", str(pid + 1), "-o",
                             "json").output) == []
    assert pidctl("list", "--broker", broker.bootstrap, "--state", "Bogus", expect=EXIT_USAGE).exit_code == EXIT_USAGE

    d = json.loads(pidctl("describe", "--broker", broker.bootstrap, "--transactional-id", "ops-tx", "-o", "json").output)
    assert (d["state"], d["producer_id"], d["timeout_ms"], d["partitions"]) == (
        "Ongoing", pid, 120_000, [{"topic": "ops", "partition": 1}])
    assert "ops-1" in pidctl("describe", "--broker", broker.bootstrap, "--transactional-id", "ops-tx").output

    producers = json.loads(pidctl("describe-producers", "--broker", broker.bootstrap, "--topic", "ops",
                                  "--partition", "1", "-o", "json").output)
    assert [(x["producer_id"], x["current_txn_start_offset"]) for x in producers] == [(pid, 0)]

    p.commit_transaction(30)  # answered once decided (PrepareCommit); the markers and the completion follow

    def state() -> str:
        return json.loads(pidctl("describe", "--broker", broker.bootstrap, "--transactional-id", "ops-tx", "-o",
                                 "json").output)["state"]
    wait_for(lambda: state() == "CompleteCommit", 10, what="the commit to complete")


def test_errors_are_one_line_with_their_exit_code(broker, pidctl):
    r = pidctl("describe", "--broker", broker.bootstrap, "--transactional-id", "nobody-tx", expect=EXIT_REFUSED)
    assert r.output.strip().splitlines() == ["error: transactional id 'nobody-tx': TRANSACTIONAL_ID_NOT_FOUND"]
    closed = f"127.0.0.1:{free_ports(1)[0]}"
    r = pidctl("list", "--broker", closed, expect=EXIT_UNAVAILABLE)
    assert r.output.strip().splitlines() == [f"error: broker {closed}: Connection refused"]
    r = pidctl("list", "--broker", "nonsense", expect=EXIT_USAGE)
    assert "is not HOST:PORT" in r.output
    r = pidctl("abort", "--broker", broker.bootstrap, "--transactional-id", "nobody-tx", expect=EXIT_REFUSED)
    assert r.output.strip() == "error: transactional id 'nobody-tx': TRANSACTIONAL_ID_NOT_FOUND"
    r = pidctl("abort", "--broker", broker.bootstrap, "--topic", "t", expect=EXIT_USAGE)
    assert "--topic needs --partition" in r.output


# ------------------------------------------------------------------ a producer killed mid-transaction
_PRODUCER = """
import sys
from confluent_kafka import KafkaException, Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "transaction.timeout.ms": 900000,
              "log_level": 0})
p.init_transactions(30)
p.begin_transaction()
for v in range(6):
    p.produce("hang", value=b"doomed-%d" % v, partition=v % 3)
assert p.flush(30) == 0
print("sent", flush=True)
sys.stdin.readline()  # the test says when to go on (a producer that was asleep)
try:
    p.commit_transaction(30)
    print("committed", flush=True)
except KafkaException as e:
    err = e.args[0]
    print(f"refused {err.name()} fatal={err.fatal()}", flush=True)
"""


def start_producer(bootstrap: str, tid: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _PRODUCER, bootstrap, tid], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "sent"
    return proc


def test_find_hanging_finds_a_killed_producers_transaction_and_abort_ends_it(broker, pidctl):
    proc = start_producer(broker.bootstrap, "hang-tx")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    b = broker.bootstrap
    hw = offsets(b, "hang", False)
    assert hw == {0: 2, 1: 2, 2: 2} and offsets(b, "hang", True) == {0: 0, 1: 0, 2: 0}

    # Kafka's threshold (15 minutes, transaction.max.timeout.ms): nothing is that old yet.
    assert pidctl("find-hanging", "--broker", b).output.strip() == f"no open transaction older than 15 min on {b}"
    found = wait_for(lambda: json.loads(pidctl("find-hanging", "--broker", b, "--max-transaction-timeout", "0",
                                               "-o", "json").output), 10, what="find-hanging to report it")
    assert sorted((t["topic"], t["partition"], t["start_offset"], t["transactional_id"]) for t in found) == [
        ("hang", 0, 0, "hang-tx"), ("hang", 1, 0, "hang-tx"), ("hang", 2, 0, "hang-tx")]
    pid, epoch = found[0]["producer_id"], found[0]["producer_epoch"]
    table = pidctl("find-hanging", "--broker", b, "--max-transaction-timeout", "0").output
    assert "hang-1" in table and "hang-tx" in table

    r = pidctl("abort", "--broker", b, "--topic", "hang", "--partition", "1", "--start-offset", "0")
    assert r.output.strip() == (f"aborted the transaction of 'hang-tx' on hang-0, hang-1, hang-2: producer {pid} "
                                f"epoch {epoch} fenced (now {pid} epoch {epoch + 2}); state CompleteAbort")

    # The abort markers: read_committed readers skip the data, the LSO is the high watermark (past the marker).
    assert offsets(b, "hang", True) == offsets(b, "hang", False) == {0: 3, 1: 3, 2: 3}
    assert read_committed(b, "hang") == []
    assert pidctl("find-hanging", "--broker", b, "--max-transaction-timeout", "0", "-o", "json").output.strip() == "[]"
    d = json.loads(pidctl("describe", "--broker", b, "--transactional-id", "hang-tx", "-o", "json").output)
    assert (d["producer_id"], d["producer_epoch"]) == (pid, epoch + 2)

    # The old producer, were it to come back: its batches and its EndTxn are refused, never applied.
    with RawBroker(b, timeout=5) as raw:
        raw.create_topic("other")
        # Two of the transaction's partitions, and a partition it never wrote to (the KIP-890 check refuses it).
        for topic, partition in (("hang", 1), ("hang", 0), ("other", 0)):
            records = encode_batch([(None, b"late")], producer_id=pid, producer_epoch=epoch, base_sequence=2,
                                   transactional=True)
            pd = entity(PRODUCE, 9, "PartitionProduceData", index=partition, records=records)
            td = entity(PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(pd,))
            resp = raw.call(kafka.request_entity(PRODUCE, 9, transactional_id="hang-tx", acks=-1,
                                                 timeout=datetime.timedelta(seconds=5), topic_data=(td,)))
            assert int(resp.responses[0].partition_responses[0].error_code) == int(Errors.INVALID_PRODUCER_EPOCH)
        for committed in (True, False):
            resp = raw.call(kafka.request_entity(END_TXN, 3, transactional_id="hang-tx", producer_id=pid,
                                                 producer_epoch=epoch, committed=committed))
            assert int(resp.error_code) == int(Errors.PRODUCER_FENCED)
    assert offsets(b, "hang", False) == {0: 3, 1: 3, 2: 3} and read_committed(b, "hang") == []
    assert offsets(b, "other", False) == {0: 0, 1: 0, 2: 0}

    # Aborting it again: refused, nothing to abort.
    r = pidctl("abort", "--broker", b, "--transactional-id", "hang-tx", expect=EXIT_REFUSED)
    assert r.output.strip() == "error: transactional id 'hang-tx' is Empty: no open transaction to abort"
    # The id goes on with a new instance.
    p = txn_producer(b, "hang-tx")
    p.begin_transaction()
    p.produce("hang", value=b"after", partition=0)
    p.commit_transaction(30)
    assert read_committed(b, "hang") == [b"after"]


def test_a_producer_that_wakes_up_after_the_abort_is_fenced(broker, pidctl):
    proc = start_producer(broker.bootstrap, "sleepy-tx")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        r = pidctl("abort", "--broker", broker.bootstrap, "--transactional-id", "sleepy-tx", "-o", "json")
        out = json.loads(r.output)
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "refused _FENCED fatal=True"
        assert out["state"] == "CompleteAbort" and out["producer_epoch"] == out["fenced_producer_epoch"] + 2
    finally:
        proc.kill()
        proc.wait()
    assert read_committed(broker.bootstrap, "hang") == []
    assert offsets(broker.bootstrap, "hang", True) == offsets(broker.bootstrap, "hang", False)


def test_abort_is_refused_when_the_transaction_moved_on(broker, pidctl):
    b = broker.bootstrap
    old = txn_producer(b, "moved-tx")
    old.begin_transaction()
    old.produce("moved", value=b"x", partition=0)
    assert old.flush(30) == 0
    d = json.loads(pidctl("describe", "--broker", b, "--transactional-id", "moved-tx", "-o", "json").output)
    pid, epoch = d["producer_id"], d["producer_epoch"]
    # Another instance takes the id over (aborting the old one's transaction) and begins its own.
    new = txn_producer(b, "moved-tx")
    new.begin_transaction()
    new.produce("moved", value=b"y", partition=0)
    assert new.flush(30) == 0
    # The operator's abort names the producer it looked at: refused, the new instance's transaction untouched.
    r = pidctl("abort", "--broker", b, "--transactional-id", "moved-tx", "--producer-id", str(pid),
               "--producer-epoch", str(epoch), expect=EXIT_REFUSED)
    assert r.output.strip() == (f"error: transactional id 'moved-tx': its open transaction is not the one named: "
                                f"epoch {epoch} (the coordinator has {epoch + 2})")
    new.commit_transaction(30)
    assert read_committed(b, "moved") == [b"y"]
    # A partition with no open transaction: nothing to abort.
    r = pidctl("abort", "--broker", b, "--topic", "moved", "--partition", "0", expect=EXIT_REFUSED)
    assert r.output.strip() == "error: moved-0 has no open transaction"


def test_the_abort_itself_is_guarded_by_the_quorum(broker):
    """The check before the abort is the operator's view; the InitProducerId that aborts carries the producer it
    expects, so a takeover between the look and the abort is refused by the quorum, not applied."""
    b = broker.bootstrap
    old = txn_producer(b, "race-tx")
    old.begin_transaction()
    old.produce("race", value=b"x", partition=0)
    assert old.flush(30) == 0

    async def describe(admin):
        return (await admin.describe_transactions(["race-tx"]))[0]

    async def init(admin, pid, epoch):
        with pytest.raises(BrokerRefused) as e:
            await admin.init_producer_id("race-tx", 60_000, pid, epoch)
        return e.value.code

    looked = with_admin(b, describe)  # the operator looks: the old producer's open transaction
    new = txn_producer(b, "race-tx")  # a new instance takes over before the abort is sent
    new.begin_transaction()
    new.produce("race", value=b"y", partition=0)
    assert new.flush(30) == 0
    assert with_admin(b, init, looked["producer_id"], looked["producer_epoch"]) == int(Errors.PRODUCER_FENCED)
    assert with_admin(b, describe)["state"] == "Ongoing"  # the new instance's transaction goes on
    new.commit_transaction(30)
    assert read_committed(b, "race") == [b"y"]


def with_admin(bootstrap: str, fn, *args):
    async def go():
        admin = BrokerAdmin(bootstrap, 15)
        try:
            return await fn(admin, *args)
        finally:
            await admin.close()
    return asyncio.run(go())
