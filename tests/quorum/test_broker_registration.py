"""A live broker registration is not replaced by a new incarnation (Kafka's DUPLICATE_BROKER_REGISTRATION).

Unit tests first (generate/replay, no Raft): the rule, its boundary, replay and snapshots, a failover
leader; then one run against a real three-node quorum (LocalCluster): the wire answer, the CLI, a
failover, and a restarted broker's ProducerIdManager that comes up once the old session lapses.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from click.testing import CliRunner

from broker.pid_manager import PidManagerConfig, ProducerIdManager
from cli.common import EXIT_REFUSED
from cli.main import cli
from quorum.client import api as p
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.config import ConfigError, from_dict
from quorum.managers import DEFAULT_BROKER_SESSION_TIMEOUT_MS, Context, QuorumState
from quorum.managers.registrations import _utc
from quorum.rpcs import RPCS
from records import RegisterBrokerRecord, UnfenceBrokerRecord
from records.wire.errors import DuplicateBrokerRegistrationError, PidQuorumError, StaleBrokerEpochError
from tests.conftest import cluster_harness, run, wait_for

T = 1_700_000_000_000  # ms: the leader's clock when broker 1 registers
TIMEOUT = DEFAULT_BROKER_SESSION_TIMEOUT_MS


class Log:
    """A leader's side of the log: what it commits, entry by entry (the records carry its clock)."""

    def __init__(self) -> None:
        self.state = QuorumState()
        self.entries: list[list] = []

    def commit(self, result):
        refused = [o for o in self.state.apply_batch(result.records) if not o.accepted]
        assert not refused, refused
        self.entries.append(list(result.records))
        return result.response

    def register(self, broker_id: int, incarnation: str, now_ms: int) -> int:
        return self.commit(self.state.registrations.generate_register(broker_id, incarnation, "h:1", now_ms))

    def heartbeat(self, broker_id: int, epoch: int, now_ms: int, fence: bool = False):
        return self.commit(self.state.registrations.generate_heartbeat(broker_id, epoch, fence, False, now_ms))

    def replayed(self) -> QuorumState:
        """The state any other node (a follower, a new leader, a restarted node) builds from the log."""
        other = QuorumState()
        for records in self.entries:
            assert all(o.accepted for o in other.apply_batch(records))
        return other


def answer(state: QuorumState, broker_id: int, incarnation: str, now_ms: int, timeout_ms: int = TIMEOUT):
    """What ``state`` answers a registration at ``now_ms``: an epoch, or the refusal's message."""
    try:
        return state.registrations.generate_register(broker_id, incarnation, "h:2", now_ms, timeout_ms).response
    except DuplicateBrokerRegistrationError as e:
        return e.message


@pytest.fixture
def log() -> Log:
    """Broker 1 registered at T (incarnation "old"), heartbeating at T + 1 s."""
    log = Log()
    assert log.register(1, "old", T) == 1
    log.heartbeat(1, 1, T + 1000)
    return log


# ------------------------------------------------------------------ the rule


def test_a_new_incarnation_of_a_live_registration_is_refused_naming_it(log):
    before = log.state.snapshot_records()
    with pytest.raises(DuplicateBrokerRegistrationError) as e:
        log.state.registrations.generate_register(1, "new", "h:2", T + 5000)
    assert int(e.value.code) == 101 and e.value.code.name == "DUPLICATE_BROKER_REGISTRATION"
    expires = T + 1000 + TIMEOUT
    assert e.value.message == (f"broker 1 is registered by live incarnation old: its session expires at "
                               f"{_utc(expires)} (in {expires - (T + 5000)} ms) unless it heartbeats again; "
                               "a new incarnation can register once it has lapsed")
    assert "\n" not in e.value.message
    assert log.state.snapshot_records() == before  # nothing changed: the running broker keeps its epoch
    assert log.state.registrations.check_epoch(1, 1).incarnation_id == "old"


def test_the_same_incarnation_again_is_accepted_with_its_epoch(log):
    res = log.state.registrations.generate_register(1, "old", "h:1", T + 5000)
    assert (res.records, res.response) == ([], 1)


def test_a_new_incarnation_registers_once_the_session_has_lapsed(log):
    expires = T + 1000 + TIMEOUT
    assert "live incarnation old" in answer(log.state, 1, "new", expires)  # its last millisecond: still live
    assert log.register(1, "new", expires + 1) == 2
    reg = log.state.registrations.brokers[1]
    assert (reg.incarnation_id, reg.broker_epoch, reg.heartbeat_ms) == ("new", 2, None)
    with pytest.raises(StaleBrokerEpochError):
        log.state.registrations.check_epoch(1, 1)  # the old process (if any) is fenced now


def test_each_heartbeat_moves_the_session_on(log):
    log.heartbeat(1, 1, T + 8000)
    assert "live incarnation old" in answer(log.state, 1, "new", T + 1000 + TIMEOUT + 1)
    assert answer(log.state, 1, "new", T + 8000 + TIMEOUT + 1) == 2
    # The same millisecond again moves nothing: nothing to log.
    assert log.state.registrations.generate_heartbeat(1, 1, False, False, T + 8000).records == []


def test_a_registration_without_a_session_is_not_protected():
    """A registration that never heartbeated, a fenced one, and an unregistered one hold no session."""
    log = Log()
    log.register(1, "old", T)
    assert answer(log.state, 1, "new", T + 1) == 2  # never heartbeated (Kafka brokers heartbeat at once)
    log.heartbeat(1, 1, T + 1000)
    log.heartbeat(1, 1, T + 2000, fence=True)
    assert answer(log.state, 1, "new", T + 3000) == 2  # fenced (Kafka: a fenced broker has no valid session)
    log.heartbeat(1, 1, T + 4000)  # unfenced again: live
    assert "live incarnation old" in answer(log.state, 1, "new", T + 5000)


def test_other_broker_ids_are_not_affected(log):
    assert log.register(2, "old", T + 2000) == 2
    assert answer(log.state, 2, "other", T + 2001) == 3


def test_the_rpc_uses_the_batch_clock_and_the_session_timeout_of_its_context(log):
    register = RPCS.of(p.BROKER_REGISTRATION, None)
    body = p.registration_request(1, uuid.UUID(int=7), "h:2")
    ctx = Context(block_size=10, now_ms=T + 5000, txn=None)
    assert ctx.session_timeout_ms == DEFAULT_BROKER_SESSION_TIMEOUT_MS
    with pytest.raises(DuplicateBrokerRegistrationError):
        register.generate(log.state, body, ctx)
    short = Context(block_size=10, now_ms=T + 5000, txn=None, session_timeout_ms=3000)
    res = register.generate(log.state, body, short)  # that session lapsed at T + 4 s
    assert res.response == 2 and res.records[0].timestamp_ms == T + 5000  # the decision's time is logged
    # The answer on the wire: Kafka's code 101.
    answer_body = register.error(0, DuplicateBrokerRegistrationError.code, "m", 0)
    assert int(answer_body.error_code) == 101


# ------------------------------------------------------------------ determinism


def test_replay_gives_the_same_answers_whatever_the_clock_at_apply_time(log, monkeypatch):
    log.heartbeat(1, 1, T + 6000)
    times = [T + 2000, T + 6000 + TIMEOUT, T + 6000 + TIMEOUT + 1, T + 60_000]
    expected = [answer(log.state, 1, "new", t) for t in times]
    assert isinstance(expected[1], str) and expected[2] == 2
    for clock in (0.0, 4e9):  # replay never reads the local clock
        monkeypatch.setattr(time, "time", lambda c=clock: c)
        monkeypatch.setattr(time, "monotonic", lambda c=clock: c)
        replayed = log.replayed()
        assert [answer(replayed, 1, "new", t) for t in times] == expected
        snap = QuorumState.from_records(log.state.snapshot_records())
        assert [answer(snap, 1, "new", t) for t in times] == expected
        assert snap.summary() == log.state.summary() == replayed.summary()


def test_the_session_is_in_the_log_and_in_snapshots(log):
    assert log.entries[-1] == [UnfenceBrokerRecord(broker_id=1, broker_epoch=1, timestamp_ms=T + 1000)]
    snap = log.state.snapshot_records()
    assert RegisterBrokerRecord(broker_id=1, incarnation_id="old", broker_epoch=1, listener="h:1") in snap
    assert UnfenceBrokerRecord(broker_id=1, broker_epoch=1, timestamp_ms=T + 1000) in snap
    assert log.state.summary()["brokers"][0]["last_heartbeat_ms"] == T + 1000
    # Fenced: the session is kept under the fence, and the snapshot says both.
    log.heartbeat(1, 1, T + 2000, fence=True)
    snap_state = QuorumState.from_records(log.state.snapshot_records())
    assert snap_state.registrations.brokers[1] == log.state.registrations.brokers[1]


# ------------------------------------------------------------------ failover


def test_a_new_leader_is_as_conservative_as_the_old_one(log):
    """Liveness is replicated state, so a leader that takes over knows every session its predecessor
    answered for: it refuses until the last logged heartbeat's session lapses, even with a clock behind."""
    log.heartbeat(1, 1, T + 5000)  # the old leader's last entry
    new_leader = log.replayed()
    assert "live incarnation old" in answer(new_leader, 1, "new", T + 5001)  # at once after the takeover
    # Its clock is 2 s behind the old leader's: a heartbeat it logs does not move the session back.
    res = new_leader.registrations.generate_heartbeat(1, 1, False, False, T + 3000)
    assert res.records == []
    new_leader.apply_batch([UnfenceBrokerRecord(broker_id=1, broker_epoch=1, timestamp_ms=T + 3000)])
    assert new_leader.registrations.brokers[1].heartbeat_ms == T + 5000
    assert "live incarnation old" in answer(new_leader, 1, "new", T + 5000 + TIMEOUT)
    assert answer(new_leader, 1, "new", T + 5000 + TIMEOUT + 1) == 2


def test_a_generated_batch_sees_the_heartbeat_before_it(log):
    """One batch (the proposer's scratch fork): a heartbeat, then a new incarnation in the same batch."""
    scratch = log.state.fork()
    res = scratch.registrations.generate_heartbeat(1, 1, False, False, T + 20_000)
    scratch.apply_batch(res.records)
    assert "live incarnation old" in answer(scratch, 1, "new", T + 20_000)
    assert answer(log.state, 1, "new", T + 20_000) == 2  # the applied state: that heartbeat is not committed


# ------------------------------------------------------------------ the broker's registration loop


class RefusingQuorum:
    """A quorum whose broker id is held by a live session for the first ``refusals`` registrations."""

    def __init__(self, refusals: int):
        self.refusals = refusals
        self.calls = 0

    async def register_broker(self, broker_id, incarnation_id=None, listener=""):
        self.calls += 1
        if self.calls <= self.refusals:
            raise DuplicateBrokerRegistrationError(f"broker {broker_id} is registered by live incarnation x")
        return 5

    async def allocate(self, broker_id, broker_epoch):
        class Block:
            start, length, throttle_ms = 0, 100, 0
        return Block()


def test_a_restarted_broker_retries_the_refusal_until_it_registers():
    cfg = PidManagerConfig(backoff_initial_s=0.001, backoff_max_s=0.002, start_timeout_s=10)

    async def go():
        quorum = RefusingQuorum(refusals=3)
        m = ProducerIdManager(1, quorum, config=cfg)
        await m.start()
        try:
            return quorum.calls, m.broker_epoch, dict(m._register_errors), m.generate_producer_id()
        finally:
            await m.close()
    calls, epoch, errors, pid = asyncio.run(go())
    assert (calls, epoch, pid) == (4, 5, 0)
    assert errors == {"DuplicateBrokerRegistrationError": 3}


# ------------------------------------------------------------------ a real quorum


def _client(addresses, timeout=10.0) -> QuorumClient:
    return QuorumClient(addresses, RetryPolicy(timeout=timeout, attempt_timeout=2.0))


def test_a_real_quorum_refuses_a_second_incarnation_until_the_session_lapses(cluster, tmp_path):
    addresses = cluster.lc.client_addresses()
    broker_id = 4101
    old, new = uuid.uuid4(), uuid.uuid4()

    async def setup():
        c = _client(addresses)
        try:
            epoch = await c.register_broker(broker_id, old, "127.0.0.1:9001")
            await c.heartbeat(broker_id, epoch)
            # On the wire: Kafka's code 101 (whichever node answers; a follower forwards to the leader).
            for address in addresses:
                body = await c._conn(address).call(p.registration_request(broker_id, new, "127.0.0.1:9002"), 5.0)
                assert int(body.error_code) == 101, address
            with pytest.raises(PidQuorumError):
                await c.register_broker(broker_id, new)
            assert await c.register_broker(broker_id, old, "127.0.0.1:9001") == epoch  # the same incarnation
            return epoch
        finally:
            await c.close()
    epoch = run(setup())

    # pidctl prints the refusal, naming the live incarnation, on one line; exit 4 (refused).
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "none"), "--quorum", ",".join(addresses),
                                      "--timeout", "10", "broker", "register", "--broker-id", str(broker_id),
                                      "--incarnation", str(new)])
    assert result.exit_code == EXIT_REFUSED, result.output
    assert f"broker {broker_id} is registered by live incarnation {old}: its session expires at" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output

    # A new leader refuses too: the session is in the log, not in the old leader's memory.
    async def heartbeat():
        c = _client(addresses)
        try:
            await c.heartbeat(broker_id, epoch)
        finally:
            await c.close()
    run(heartbeat())
    beat = time.monotonic()
    leader = cluster.leader()
    cluster.lc.kill(leader)
    cluster.leader(timeout=20)
    survivors = [n.client_address for n in cluster.lc.nodes() if n.node_id != leader]

    async def after_failover():
        c = _client(survivors, timeout=20.0)
        try:
            try:
                await c.register_broker(broker_id, new)
            except PidQuorumError:
                return "refused"
            return "accepted"
        finally:
            await c.close()
    outcome = run(after_failover())
    if time.monotonic() - beat < TIMEOUT / 1000:
        assert outcome == "refused"

    # The broker restarted as ``new`` (the old process is gone: no more heartbeats): its ProducerIdManager
    # keeps retrying the refusal and comes up once the old session has lapsed.
    async def restarted():
        c = _client(survivors, timeout=20.0)
        cfg = PidManagerConfig(backoff_initial_s=0.05, backoff_max_s=0.5, start_timeout_s=TIMEOUT / 1000 + 20)
        m = ProducerIdManager(broker_id, c, listener="127.0.0.1:9002", config=cfg)
        m.incarnation_id = new
        try:
            await m.start()
            return m.broker_epoch, time.monotonic(), m.generate_producer_id()
        finally:
            await m.close(shut_down=False)  # keeps the registration (a clean stop would remove it): see below
            await c.close()
    new_epoch, up, pid = run(restarted())
    assert new_epoch > epoch and pid >= 0
    assert up - beat >= TIMEOUT / 1000 - 0.5  # not before the old session lapsed (the leaders' clocks, not ours)
    wait_for(lambda: any(b["broker_id"] == broker_id and b["incarnation_id"] == str(new)
                         for d in cluster.describe_all().values() for b in d["state"]["brokers"]),
             10, what="every node to apply the new registration")


# ------------------------------------------------------------------ the node setting broker_session_timeout_ms


def test_broker_session_timeout_ms_is_a_checked_node_setting(tmp_path):
    base = {"node_id": 1, "data_dir": "d", "raft_address": "127.0.0.1:1", "client_address": "127.0.0.1:2",
            "secret": "s"}
    assert from_dict(base, str(tmp_path)).broker_session_timeout_ms == DEFAULT_BROKER_SESSION_TIMEOUT_MS == 9000
    assert from_dict({**base, "broker_session_timeout_ms": 1500}, str(tmp_path)).broker_session_timeout_ms == 1500
    for bad in (0, -1, "9000", 10**10):
        with pytest.raises(ConfigError, match="broker_session_timeout_ms"):
            from_dict({**base, "broker_session_timeout_ms": bad}, str(tmp_path))


SHORT_SESSION_MS = 1500


@pytest.fixture
def short_session_cluster(tmp_path, request):
    yield from cluster_harness(tmp_path, request, broker_session_timeout_ms=SHORT_SESSION_MS)


def test_the_leader_decides_with_the_nodes_broker_session_timeout_ms(short_session_cluster):
    """A quorum whose nodes have broker_session_timeout_ms = 1.5 s frees a broker id 1.5 s after the last
    heartbeat, long before the default 9 s."""
    addresses = short_session_cluster.lc.client_addresses()
    broker_id, old, new = 4102, uuid.uuid4(), uuid.uuid4()

    async def go():
        c = _client(addresses)
        try:
            epoch = await c.register_broker(broker_id, old, "127.0.0.1:9001")
            await c.heartbeat(broker_id, epoch)
            beat = time.monotonic()
            with pytest.raises(DuplicateBrokerRegistrationError):
                await c.register_broker(broker_id, new)
            deadline = beat + 6.0  # the default session (9 s) would still be live
            while True:
                try:
                    return beat, time.monotonic(), epoch, await c.register_broker(broker_id, new)
                except DuplicateBrokerRegistrationError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
        finally:
            await c.close()
    beat, accepted, epoch, new_epoch = run(go())
    assert new_epoch > epoch
    assert SHORT_SESSION_MS / 1000 - 0.5 <= accepted - beat < 6.0  # (the leader's clock, not ours)
