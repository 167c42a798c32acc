"""Producer IDs bound to the principal they were handed to (broker/pid_binding.py), without processes: a
``BrokerServer`` object with SASL's pieces put in by hand (ACLs, principals), a stand-in ID manager and
coordinator, and the durable record in a temporary directory."""
from __future__ import annotations

import asyncio
import datetime
import errno
import os

import pytest

from broker import frontend
from broker.config import BrokerConfig
from broker.frontend import INIT_PRODUCER_ID, PRODUCE, BrokerServer
from broker.pid_binding import (
    FILE_NAME,
    MAGIC,
    PRINCIPAL,
    TRANSACTIONAL_ID,
    ProducerBindings,
    batch_producers,
)
from broker.framelog import encode_frames
from broker.recordbatch import decode_all, encode_batch
from quorum.security import acl as a
from quorum.security.acl import AclIndex
from snapshots.storage.disk import CorruptFileError, Disk
from tests.support.kafka_requests import entity
from records.wire import kafka
from records.wire.errors import Errors, InvalidProducerIdMappingError, PidQuorumError, ProducerFencedError

ALICE, MALLORY = "User:alice", "User:mallory"
ACLS = [a.Acl(ALICE, a.CLUSTER, a.CLUSTER_NAME, a.LITERAL, a.IDEMPOTENT_WRITE, a.ALLOW),
        a.Acl(MALLORY, a.CLUSTER, a.CLUSTER_NAME, a.LITERAL, a.IDEMPOTENT_WRITE, a.ALLOW),
        a.Acl(ALICE, a.TRANSACTIONAL_ID, "alice-", a.PREFIXED, a.WRITE, a.ALLOW),
        a.Acl(MALLORY, a.TRANSACTIONAL_ID, "mallory-", a.PREFIXED, a.WRITE, a.ALLOW),
        # Produce needs WRITE on the topic (PRODUCE_TOPIC_ACL).  The attacker has it too: what refuses him here
        # must be the producer-ID binding, not a missing topic ACL.
        a.Acl(ALICE, a.TOPIC, "t", a.LITERAL, a.WRITE, a.ALLOW),
        a.Acl(MALLORY, a.TOPIC, "t", a.LITERAL, a.WRITE, a.ALLOW)]
DAY_MS = 24 * 3600 * 1000


class FakePids:
    """IDs handed out in order, as a block would."""

    def __init__(self, start: int = 1000):
        self.next = start
        self.broker_epoch = 1

    def generate_producer_id(self) -> int:
        self.next += 1
        return self.next - 1

    async def close(self) -> None:
        pass


class FakeTxn:
    """The quorum's answers for transactional ids: tid -> (pid, epoch); verify accepts the current pair."""

    def __init__(self, start: int = 5000):
        self.ids: dict[str, tuple[int, int]] = {}
        self.next = start
        self.counters: dict = {}

    async def init_producer_id(self, tid, timeout_ms, pid, epoch):
        if tid not in self.ids:
            self.ids[tid] = (self.next, 0)
            self.next += 1
        else:
            p, e = self.ids[tid]
            self.ids[tid] = (p, e + 1)
        return self.ids[tid]

    async def verify(self, tid, pid, epoch, topic, partition):
        if self.ids.get(tid, (None, None))[0] != pid:
            raise InvalidProducerIdMappingError(f"transactional id {tid!r} has no producer {pid}")
        if self.ids[tid][1] != epoch:
            raise ProducerFencedError("fenced")


class Clock:
    def __init__(self):
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


class Broker:
    """A BrokerServer object as a SASL broker has it, driven on one event loop."""

    def __init__(self, data_dir: str, clock: Clock, expiration_ms: int = DAY_MS, max_producers: int = 1000):
        self.data_dir, self.clock = data_dir, clock
        cfg = BrokerConfig(broker_id=1, quorum=["127.0.0.1:1"], data_dir=data_dir, listen="127.0.0.1:0",
                           producer_id_expiration_ms=expiration_ms, max_producers_per_partition=max_producers)
        self.server = s = BrokerServer(cfg)
        s.counters["authorization_failures"] = 0
        s.acls = AclIndexCache(ACLS)
        s.pids = FakePids()
        s.txn = FakeTxn()
        s.bindings = ProducerBindings(data_dir, expiration_ms * frontend.BINDING_LIFETIME_EXPIRATIONS, max_producers,
                                      lambda fn, *args: asyncio.get_running_loop().run_in_executor(s._io, fn, *args),
                                      disk=Disk(failstop=_raise), clock=clock)
        s.bindings.open()
        s.bindings.start()

    async def call(self, principal: str, api_key: int, version: int, **fields):
        req = kafka.Request(api_key, version, 1, "test", kafka.request_entity(api_key, version, **fields))
        req.principal, req.host = principal, "127.0.0.1"
        try:
            self.server._authorize(req, ("127.0.0.1", 1))
            return await self.server._handle(req)
        except PidQuorumError as e:
            return self.server._error_body(api_key, version, e.code, req.body)

    async def init(self, principal: str, tid: str | None = None) -> tuple[Errors, int, int]:
        r = await self.call(principal, INIT_PRODUCER_ID, 4, transactional_id=tid,
                            transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
        return Errors(int(r.error_code)), int(r.producer_id), int(r.producer_epoch)

    async def produce(self, principal: str, pid: int, epoch: int, seq: int, value: bytes = b"v", topic: str = "t",
                      tid: str | None = None, transactional: bool = False) -> tuple[Errors, int, str | None]:
        records = encode_batch([(None, value)], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                               transactional=transactional)
        pd = entity(PRODUCE, 9, "PartitionProduceData", index=0, records=records)
        td = entity(PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(pd,))
        r = await self.call(principal, PRODUCE, 9, transactional_id=tid, acks=-1,
                            timeout=datetime.timedelta(seconds=5), topic_data=(td,))
        p = r.responses[0].partition_responses[0]
        return Errors(int(p.error_code)), int(p.base_offset), p.error_message

    def values(self, topic: str = "t") -> list[bytes]:
        if self.server.storage.topic(topic) is None:
            return []
        data = self.server.storage.partition(topic, 0).read(0, 1 << 20)
        return [value for _, _, _, value in decode_all(data)] if data else []

    async def close(self) -> None:
        await self.server.bindings.close()
        self.server._io.shutdown(wait=True)
        self.server.storage.close()

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class AclIndexCache:
    def __init__(self, acls):
        self._index = AclIndex(acls)

    def authorize(self, principal, resource_type, name, operation, host):
        return self._index.authorize(principal, resource_type, name, operation, (), host)


def _raise(code: int, message: str) -> None:
    """A failstop that returns (Disk raises StorageFailure)."""


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def clock():
    return Clock()


# ------------------------------------------------------------------ the attacks of the report
def test_another_principal_cannot_pre_empt_the_victims_first_batch(tmp_path, clock):
    async def go():
        async with Broker(str(tmp_path), clock) as b:
            code, pid, epoch = await b.init(ALICE)
            assert code == Errors.NONE
            # mallory (IDEMPOTENT_WRITE, no relation to the ID) sends alice's first batch before she does
            code, offset, why = await b.produce(MALLORY, pid, epoch, 0, b"mallory's")
            assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and offset == -1
            assert f"producer id {pid}" in why and MALLORY in why
            # ... and the ID that will be handed out next (not bound yet): refused too, nothing written
            code, _, why = await b.produce(MALLORY, pid + 1, 0, 0, b"next one")
            assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and f"producer id {pid + 1}" in why
            assert await b.produce(ALICE, pid, epoch, 0, b"alice's") == (Errors.NONE, 0, None)
            assert b.values() == [b"alice's"]
            assert b.server.counters["producer_id_refused"] == 2
    run(go())


def test_a_higher_epoch_does_not_fence_the_owner(tmp_path, clock):
    async def go():
        async with Broker(str(tmp_path), clock) as b:
            _, pid, epoch = await b.init(ALICE)
            assert (await b.produce(ALICE, pid, epoch, 0, b"a0"))[0] == Errors.NONE
            code, _, why = await b.produce(MALLORY, pid, epoch + 5, 0, b"fence")
            assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and str(pid) in why
            assert await b.produce(ALICE, pid, epoch, 1, b"a1") == (Errors.NONE, 1, None)
            assert b.values() == [b"a0", b"a1"]
            part = b.server.storage.partition("t", 0)
            assert [(p, e) for p, e, *_ in part.describe_producers(10)[0]] == [(pid, epoch)]
    run(go())


def test_a_transactional_producers_id_is_refused_to_another_principal(tmp_path, clock):
    async def go():
        async with Broker(str(tmp_path), clock) as b:
            code, pid, epoch = await b.init(ALICE, "alice-tx")
            assert code == Errors.NONE
            # a non-transactional batch with it, no transactional id named
            code, _, why = await b.produce(MALLORY, pid, epoch + 1, 0)
            assert code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and str(pid) in why and MALLORY in why
            # a transactional batch naming mallory's own id (which mallory may write)
            code, _, why = await b.produce(MALLORY, pid, epoch, 0, tid="mallory-tx", transactional=True)
            assert code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and str(pid) in why
            # naming alice's id: mallory may not write it (whole request)
            code, _, _ = await b.produce(MALLORY, pid, epoch, 0, tid="alice-tx", transactional=True)
            assert code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert b.values() == []
            # alice's own transactional batch goes on to the coordinator's check and is appended
            assert (await b.produce(ALICE, pid, epoch, 0, b"tx", tid="alice-tx", transactional=True))[0] == Errors.NONE
            assert b.values() == [b"tx"]
    run(go())


def test_a_non_transactional_produce_naming_another_principals_transactional_id(tmp_path, clock):
    async def go():
        async with Broker(str(tmp_path), clock) as b:
            _, pid, epoch = await b.init(MALLORY)
            code, _, _ = await b.produce(MALLORY, pid, epoch, 0, tid="alice-tx")
            assert code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert (await b.produce(MALLORY, pid, epoch, 0, tid="mallory-tx"))[0] == Errors.NONE  # its own: WRITE
            assert b.values() == [b"v"]
    run(go())


def test_the_binding_survives_a_restart_and_the_attacker_cannot_claim_an_id_after_it(tmp_path, clock):
    async def go():
        b = Broker(str(tmp_path), clock)
        _, pid, epoch = await b.init(ALICE)
        _, tx_pid, tx_epoch = await b.init(ALICE, "alice-tx")
        unused = b.server.pids.next  # handed out by nobody
        assert (await b.produce(ALICE, pid, epoch, 0, b"before"))[0] == Errors.NONE
        await b.close()
        async with Broker(str(tmp_path), clock) as b:
            assert (await b.produce(MALLORY, pid, epoch, 1))[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
            assert (await b.produce(MALLORY, tx_pid, tx_epoch, 0))[0] == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert (await b.produce(MALLORY, unused, 0, 0))[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
            assert (await b.produce(ALICE, pid, epoch, 1, b"after"))[0] == Errors.NONE
            assert b.values() == [b"before", b"after"]
    run(go())


def test_a_crash_keeps_every_answered_binding(tmp_path, clock):
    """No close: the file holds what InitProducerId was answered after (appended, fdatasync'd)."""
    async def go():
        b = Broker(str(tmp_path), clock)
        answered = [(await b.init(ALICE))[1] for _ in range(3)] + [(await b.init(MALLORY))[1]]
        await asyncio.gather(*(b.init(ALICE) for _ in range(20)))  # group commit: fewer syncs than bindings
        st = b.server.bindings.stats()
        assert st["producer_bindings_written"] == 24 and st["producer_binding_syncs"] < 24
        b.server.bindings._writer.cancel()
        return answered
    answered = run(go())
    loaded = ProducerBindings(str(tmp_path), DAY_MS, 1000, clock=clock)
    loaded.open()
    assert [loaded.owner(p) for p in answered] == [(PRINCIPAL, ALICE)] * 3 + [(PRINCIPAL, MALLORY)]
    assert loaded.stats()["producer_bindings"] == 24


def test_after_the_producer_state_expires_the_owner_goes_on_and_others_are_refused(tmp_path, clock):
    """The partitions forget an idle producer after producer_id_expiration_ms; its binding lives 7 times as
    long, so the owner's next batch (same ID, or an epoch it bumped itself, KIP-360) is accepted and another
    principal's is not.  Once the binding is forgotten too, nobody may use the ID (the owner re-creates
    its producer: a new InitProducerId)."""
    async def go():
        async with Broker(str(tmp_path), clock, expiration_ms=60_000) as b:
            _, pid, epoch = await b.init(ALICE)
            assert (await b.produce(ALICE, pid, epoch, 0, b"a0"))[0] == Errors.NONE
            clock.t += 61  # past the producer-state expiry
            await b.server.bindings.maintain()
            assert (await b.produce(MALLORY, pid, epoch, 1))[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
            assert (await b.produce(MALLORY, pid, epoch + 1, 0))[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
            assert (await b.produce(ALICE, pid, epoch + 1, 0, b"a1"))[0] == Errors.NONE  # its own epoch bump
            clock.t += 7 * 60 + 1  # unused for the binding's lifetime
            await b.server.bindings.maintain()
            assert b.server.bindings.owner(pid) is None
            for who in (ALICE, MALLORY):
                code, _, why = await b.produce(who, pid, epoch + 1, 1)
                assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and "bound to no principal" in why
            _, new_pid, new_epoch = await b.init(ALICE)
            assert new_pid != pid and (await b.produce(ALICE, new_pid, new_epoch, 0, b"a2"))[0] == Errors.NONE
            assert b.values() == [b"a0", b"a1", b"a2"]
            assert b.server.bindings.stats()["producer_bindings_expired"] == 1
    run(go())


def test_over_the_cap_the_least_recently_used_bindings_are_evicted(tmp_path, clock):
    async def go():
        async with Broker(str(tmp_path), clock, max_producers=100) as b:
            first = (await b.init(ALICE))[1]
            clock.t += 1
            for _ in range(100):
                await b.init(ALICE)
            assert b.server.bindings.stats()["producer_bindings"] == 100
            assert b.server.bindings.owner(first) is None
            for who in (ALICE, MALLORY):
                assert (await b.produce(who, first, 0, 0))[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
            assert b.values() == []
    run(go())


def test_the_file_is_rewritten_and_stays_bounded(tmp_path, clock):
    async def go():
        async with Broker(str(tmp_path), clock, expiration_ms=60_000, max_producers=100_000) as b:
            bindings = b.server.bindings
            for _ in range(200):
                await b.init(ALICE)
            clock.t += 7 * 60 + 1
            await bindings.maintain()  # all forgotten; a rewrite is due (lifetime / 7 passed)
            await b.init(ALICE)  # the writer runs the rewrite before this append
            assert bindings.stats()["producer_bindings"] == 1
            assert bindings.counters["producer_binding_rewrites"] >= 1
        assert os.path.getsize(tmp_path / FILE_NAME) < 100
    run(go())


def test_torn_tail_is_cut_and_damage_refuses_the_start(tmp_path, clock):
    path = tmp_path / FILE_NAME
    good = MAGIC + encode_frames([[7, PRINCIPAL, ALICE, 1]])
    path.write_bytes(good + encode_frames([[8, PRINCIPAL, ALICE, 1]])[:-3])
    bindings = ProducerBindings(str(tmp_path), DAY_MS, 10, clock=clock)
    bindings.open()
    assert bindings.owner(7) == (PRINCIPAL, ALICE) and bindings.owner(8) is None
    bindings._frames.close()
    assert path.read_bytes() == good
    damaged = bytearray(good + encode_frames([[9, TRANSACTIONAL_ID, "alice-tx", 1]]))
    damaged[len(MAGIC) + 9] ^= 0xFF  # inside the first frame, with a whole frame after it
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        ProducerBindings(str(tmp_path), DAY_MS, 10, clock=clock).open()
    path.write_bytes(b"something else")
    with pytest.raises(CorruptFileError, match="bad magic"):
        ProducerBindings(str(tmp_path), DAY_MS, 10, clock=clock).open()


def test_every_batch_of_a_partitions_records_is_checked(tmp_path, clock):
    """A benign batch first does not carry another's ID past the check."""
    mine = encode_batch([(None, b"x")], producer_id=-1, producer_epoch=-1, base_sequence=-1)
    theirs = encode_batch([(None, b"y")], producer_id=1000, producer_epoch=0, base_sequence=0)
    assert batch_producers(mine + theirs) == [(1000, False)]

    async def go():
        async with Broker(str(tmp_path), clock) as b:
            _, pid, _ = await b.init(ALICE)
            assert pid == 1000
            pd = entity(PRODUCE, 9, "PartitionProduceData", index=0, records=mine + theirs)
            td = entity(PRODUCE, 9, "TopicProduceData", name="t", partition_data=(pd,))
            r = await b.call(MALLORY, PRODUCE, 9, transactional_id=None, acks=-1,
                             timeout=datetime.timedelta(seconds=5), topic_data=(td,))
            assert int(r.responses[0].partition_responses[0].error_code) == Errors.CLUSTER_AUTHORIZATION_FAILED
            assert b.values() == []
    run(go())


def test_produce_needs_write_on_the_topic(tmp_path, clock):
    """Produce checks WRITE on each topic (PRODUCE_TOPIC_ACL, as Kafka): a topic the principal may not write is
    answered TOPIC_AUTHORIZATION_FAILED and nothing is written to it; a prefixed ACL is enough."""
    assert frontend.RPCS[PRODUCE].topic_acl == a.WRITE

    async def go():
        async with Broker(str(tmp_path), clock) as b:
            b.server.acls = AclIndexCache(ACLS + [a.Acl(ALICE, a.TOPIC, "alice-", a.PREFIXED, a.WRITE, a.ALLOW)])
            _, pid, epoch = await b.init(ALICE)
            assert (await b.produce(ALICE, pid, epoch, 0))[0] == Errors.NONE
            assert (await b.produce(ALICE, pid, epoch, 1, topic="alice-x"))[0] == Errors.NONE
            _, mpid, mepoch = await b.init(MALLORY)
            before = b.server.counters["authorization_failures"]
            assert (await b.produce(MALLORY, mpid, mepoch, 0, b"m", topic="alice-x"))[0] == \
                Errors.TOPIC_AUTHORIZATION_FAILED
            assert (await b.produce(MALLORY, mpid, mepoch, 0, b"m", topic="u"))[0] == Errors.TOPIC_AUTHORIZATION_FAILED
            assert b.server.counters["authorization_failures"] == before + 2
            assert b.values("alice-x") == [b"v"] and b.values("u") == []
    run(go())


def test_without_sasl_nothing_is_bound_nor_checked(tmp_path):
    cfg = BrokerConfig(broker_id=1, quorum=["127.0.0.1:1"], data_dir=str(tmp_path), listen="127.0.0.1:0")
    server = BrokerServer(cfg)
    try:
        assert server.sasl is None and server.bindings is None
        assert frontend.RPCS[PRODUCE].acl(kafka.request_entity(PRODUCE, 9, transactional_id=None, acks=1,
                                                                timeout=datetime.timedelta(seconds=1),
                                                                topic_data=())) is None
    finally:
        server._io.shutdown()
        server.storage.close()
    assert not os.path.exists(tmp_path / FILE_NAME)


def test_an_io_error_writing_a_binding_is_fail_stop_and_the_id_is_not_answered(tmp_path, clock):
    stops: list[tuple[int, str]] = []

    async def go():
        b = Broker(str(tmp_path), clock)
        b.server.bindings._disk.failstop = lambda code, message: stops.append((code, message))
        f = b.server.bindings._frames.file

        def failing_sync():
            f.disk.io_error("fdatasync", f.path, OSError(errno.EIO, "Input/output error"))
        f.sync = failing_sync
        try:
            for _ in range(2):  # and nothing is acknowledged after it
                with pytest.raises(OSError, match="fdatasync .*producer-ids.bindings"):
                    await b.init(ALICE)
        finally:
            b.server._io.shutdown(wait=True)
            b.server.storage.close()
    run(go())
    assert [code for code, _ in stops] == [74] and FILE_NAME in stops[0][1]
