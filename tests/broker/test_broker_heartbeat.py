"""The broker keeps its registration live: BrokerHeartbeat every ``broker_heartbeat_interval_ms``.

Without heartbeats a registration holds no session, and anyone with CLUSTER_ACTION could register the
running broker's id with a new incarnation and fence it.  Unit tests of the heartbeat task of
``ProducerIdManager`` with a fake quorum first (interval, re-registration after a stale epoch, an
unavailable quorum, the shut-down heartbeat, nothing a client waits for); then a real three-node quorum
(short ``broker_session_timeout_ms``) and real ``python -m broker`` processes.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid

import pytest

import broker.pid_manager as pid_manager
from benchmarks.processes import BrokerProcess
from broker.config import BrokerConfig
from broker.pid_manager import PidManagerConfig, ProducerIdManager
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.settings import ConfigError, build
from tests.conftest import cluster_harness, run, wait_for
from tests.support.loop import until
from records.wire.errors import (
    BrokerIdNotRegisteredError,
    CoordinatorLoadInProgressError,
    DuplicateBrokerRegistrationError,
    Errors,
    PidQuorumError,
    RequestTimedOutError,
    StaleBrokerEpochError,
    for_code,
)

FAST = PidManagerConfig(backoff_initial_s=0.001, backoff_max_s=0.01, start_timeout_s=10)


class Block:
    def __init__(self, start: int, length: int = 100):
        self.start, self.length, self.throttle_ms = start, length, 0


class FakeQuorum:
    """Registrations and heartbeats as the quorum answers them, with the time of each call."""

    def __init__(self):
        self.epoch = 0
        self.registered: int | None = None  # the live epoch
        self.registrations: list[float] = []
        self.heartbeats: list[tuple[float, int, bool]] = []  # (time, epoch, want_shut_down)
        self.next_start = 0
        self.fail_heartbeats: Exception | None = None
        self.hang_heartbeats = False

    async def register_broker(self, broker_id, incarnation_id=None, listener=""):
        self.epoch += 1
        self.registered = self.epoch
        self.registrations.append(time.monotonic())
        return self.epoch

    async def allocate(self, broker_id, broker_epoch):
        if broker_epoch != self.registered:
            raise StaleBrokerEpochError("stale")
        block, self.next_start = Block(self.next_start), self.next_start + 100
        return block

    async def heartbeat(self, broker_id, broker_epoch, want_fence=False, want_shut_down=False):
        self.heartbeats.append((time.monotonic(), broker_epoch, want_shut_down))
        if self.hang_heartbeats and not want_shut_down:
            await asyncio.Event().wait()
        if self.fail_heartbeats is not None:
            raise self.fail_heartbeats
        if broker_epoch != self.registered:
            raise StaleBrokerEpochError(f"epoch {broker_epoch} is not {self.registered}")
        if want_shut_down:
            self.registered = None
        return {"is_fenced": want_shut_down, "should_shut_down": want_shut_down}

    def beats(self, shut_down: bool = False) -> list[tuple[float, int, bool]]:
        return [b for b in self.heartbeats if b[2] == shut_down]


_until = functools.partial(until, interval=0.005)


@contextlib.asynccontextmanager
async def heartbeating(interval_ms: int):
    """(quorum, manager): broker 1's started manager on a FakeQuorum, heartbeating every ``interval_ms``;
    closed without the shut-down heartbeat."""
    q = FakeQuorum()
    m = ProducerIdManager(1, q, config=FAST, heartbeat_interval_ms=interval_ms)
    await m.start()
    try:
        yield q, m
    finally:
        await m.close(shut_down=False)


# ------------------------------------------------------------------ the heartbeat task


def test_the_first_heartbeat_follows_the_registration_then_one_every_interval():
    async def go():
        async with heartbeating(100) as (q, m):
            await _until(lambda: len(q.beats()) >= 6, what="6 heartbeats")
        return q, m
    q, m = run(go())
    times = [t for t, _, _ in q.beats()]
    assert times[0] - q.registrations[0] < 0.08  # at once, not an interval later
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(0.09 <= g < 0.5 for g in gaps), gaps
    assert {e for _, e, _ in q.beats()} == {1}
    assert m.stats()["counters"]["heartbeats"] >= 6 and m.stats()["heartbeat_interval_s"] == 0.1


@pytest.mark.parametrize("refusal", [StaleBrokerEpochError, BrokerIdNotRegisteredError])
def test_a_heartbeat_refused_for_its_epoch_registers_again_and_heartbeats_the_new_epoch(refusal):
    async def go():
        async with heartbeating(100) as (q, m):
            await _until(lambda: q.beats(), what="the first heartbeat")
            # The quorum dropped this registration (another incarnation took the id once the session lapsed,
            # or a fence): the next heartbeat is refused.
            q.fail_heartbeats = refusal("gone")
            refused_at = time.monotonic()
            await _until(lambda: len(q.registrations) >= 2, what="a second registration")
            q.fail_heartbeats = None
            await _until(lambda: m.broker_epoch is not None and any(e == m.broker_epoch for _, e, _ in q.beats()),
                         what="a heartbeat of the new epoch")
            epoch = m.broker_epoch
            first_new = min(t for t, e, _ in q.beats() if e == epoch)
            return q, refused_at, first_new, epoch, m.stats(), m.generate_producer_id()
    q, refused_at, first_new, epoch, stats, pid = run(go())
    assert epoch == len(q.registrations) >= 2 and pid >= 0
    assert q.registrations[1] - refused_at < 1.0  # within about one interval, not a session
    assert first_new - q.registrations[epoch - 1] < 0.08  # the new epoch heartbeats at once
    # Each refused heartbeat registered once, after a backoff (no tight register/heartbeat loop).
    assert stats["counters"]["heartbeat_re_registrations"] == epoch - 1 == stats["counters"]["heartbeat_errors"][
        refusal.__name__]
    assert stats["counters"]["backoffs"] >= epoch - 1


def test_an_unavailable_quorum_is_asked_again_at_the_interval_and_logged_at_most_every_10_s(caplog):
    async def go():
        async with heartbeating(50) as (q, m):
            await _until(lambda: q.beats(), what="the first heartbeat")
            q.fail_heartbeats = RequestTimedOutError("no node answered")
            n = len(q.beats())
            await _until(lambda: len(q.beats()) >= n + 8, what="8 more heartbeats")
            q.fail_heartbeats = None
            n = len(q.beats())
            await _until(lambda: len(q.beats()) >= n + 2, what="heartbeats answered again")
            return q, m.stats(), len(q.registrations)
    with caplog.at_level(logging.INFO, logger=pid_manager.log.name):
        q, stats, registrations = run(go())
    assert registrations == 1  # an unavailable quorum is not a refused epoch: no re-registration
    assert stats["counters"]["heartbeat_errors"]["RequestTimedOutError"] >= 8
    failed = [r for r in caplog.records if "heartbeat (epoch 1) failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert any("heartbeats answered again" in r.getMessage() for r in caplog.records)


def test_no_client_request_waits_for_a_heartbeat():
    """Heartbeats that never return: the manager still starts, hands IDs out and closes at once."""
    async def go():
        q = FakeQuorum()
        q.hang_heartbeats = True
        m = ProducerIdManager(1, q, config=FAST, heartbeat_interval_ms=10)
        t0 = time.monotonic()
        try:
            await m.start()
            ids = []
            while len(ids) < 250:  # three blocks: the refill task goes on too
                try:
                    ids.append(m.generate_producer_id())  # synchronous: never awaits a quorum call
                except CoordinatorLoadInProgressError:
                    await asyncio.sleep(0.001)
            served = time.monotonic() - t0
            await _until(lambda: q.beats(), what="a heartbeat in flight")
        finally:
            t1 = time.monotonic()
            await m.close()
        return ids, served, time.monotonic() - t1, q
    ids, served, closing, q = run(go())
    assert ids == list(range(250)) and served < 2.0
    assert closing < 2.0
    assert len(q.beats()) == 1  # one hung heartbeat; the next waits for it (no pile-up)
    assert len(q.beats(shut_down=True)) == 1  # the shut-down heartbeat is a call of its own


def test_a_clean_close_sends_a_heartbeat_asking_to_shut_down():
    async def go():
        q = FakeQuorum()
        m = ProducerIdManager(1, q, config=FAST, heartbeat_interval_ms=100)
        await m.start()
        await _until(lambda: q.beats(), what="the first heartbeat")
        await m.close()
        await m.close()  # once only
        return q, m
    q, m = run(go())
    assert [e for _, e, _ in q.beats(shut_down=True)] == [1]
    assert q.registered is None and m.broker_epoch is None and m.stats()["shut_down_heartbeat_sent"]

    async def without():
        async with heartbeating(100) as (q, _):
            pass  # started, then closed at once
        return q
    assert run(without()).beats(shut_down=True) == []


def test_a_shut_down_heartbeat_that_fails_does_not_hold_the_stop(monkeypatch):
    monkeypatch.setattr(pid_manager, "SHUTDOWN_HEARTBEAT_TIMEOUT_S", 0.2)

    async def go():
        q = FakeQuorum()
        m = ProducerIdManager(1, q, config=FAST, heartbeat_interval_ms=100)
        await m.start()
        q.hang_heartbeats = True

        async def hang(*args, **kwargs):
            await asyncio.Event().wait()
        q.heartbeat = hang
        t0 = time.monotonic()
        await m.close()
        return time.monotonic() - t0, m.broker_epoch
    took, epoch = run(go())
    assert took < 1.5 and epoch == 1  # not removed: its session lapses by itself


def test_a_quorum_without_heartbeat_is_not_heartbeated():
    class AllocateOnly:
        async def register_broker(self, broker_id, incarnation_id=None, listener=""):
            return 3

        async def allocate(self, broker_id, broker_epoch):
            return Block(0)

    async def go():
        m = ProducerIdManager(1, AllocateOnly(), config=FAST)
        await m.start()
        await m.close()
        return m
    m = run(go())
    assert not m.heartbeats_enabled and m.stats()["heartbeat_interval_s"] is None


# ------------------------------------------------------------------ settings and the error code


def test_broker_heartbeat_interval_ms_is_validated_and_reaches_the_manager():
    assert BrokerConfig(broker_id=1, quorum=["h:1"]).broker_heartbeat_interval_ms == 2000  # Kafka's default
    cfg = BrokerConfig(broker_id=1, quorum=["h:1"], broker_heartbeat_interval_ms=250)
    assert ProducerIdManager(1, FakeQuorum(), heartbeat_interval_ms=cfg.broker_heartbeat_interval_ms
                             ).heartbeat_interval_s == 0.25  # as the broker's front end passes it
    assert ProducerIdManager(1, FakeQuorum()).heartbeat_interval_s == 2.0
    for bad in (0, 9000, 60_000, "2000"):
        with pytest.raises(ConfigError, match="broker_heartbeat_interval_ms"):
            build(BrokerConfig, {"broker_id": 1, "quorum": ["h:1"], "broker_heartbeat_interval_ms": bad})


def test_duplicate_broker_registration_is_kafkas_101_and_not_retried_by_clients():
    err = for_code(101, "held")
    assert isinstance(err, DuplicateBrokerRegistrationError)
    assert err.code == Errors.DUPLICATE_BROKER_REGISTRATION and not err.retriable


# ------------------------------------------------------------------ a real quorum and real brokers

SESSION_MS = 3000  # the quorum's broker_session_timeout_ms in these tests
INTERVAL_MS = 300


@pytest.fixture
def short_sessions(tmp_path, request):
    yield from cluster_harness(tmp_path, request, broker_session_timeout_ms=SESSION_MS)


def _broker(tmp_path, cluster, broker_id: int) -> BrokerProcess:
    return BrokerProcess(str(tmp_path), broker_id, cluster.lc.client_addresses(), "--broker-heartbeat-interval-ms",
                         str(INTERVAL_MS), "--pid-manager-backoff-max-s", "0.2")


def _registration(cluster, broker_id: int) -> dict | None:
    async def go():
        c = QuorumClient(cluster.lc.client_addresses(), RetryPolicy(timeout=10.0, attempt_timeout=2.0))
        try:
            _, state = await c.find_leader(5.0)
        finally:
            await c.close()
        return next((b for b in state["state"]["brokers"] if b["broker_id"] == broker_id), None)
    return run(go())


def _register(cluster, broker_id: int, incarnation: uuid.UUID) -> int | PidQuorumError:
    """A BrokerRegistration of ``broker_id`` by another process (or principal): its epoch or the refusal."""
    async def go():
        c = QuorumClient(cluster.lc.client_addresses(), RetryPolicy(timeout=10.0, attempt_timeout=2.0))
        try:
            return await c.register_broker(broker_id, incarnation, "127.0.0.1:1")
        except PidQuorumError as e:
            return e
        finally:
            await c.close()
    return run(go())


def _heartbeating(cluster, broker_id: int, for_ms: int) -> dict:
    """Wait until the broker's logged heartbeats span more than ``for_ms`` (so a registration that only
    heartbeated once would have lapsed by now)."""
    first = wait_for(lambda: (_registration(cluster, broker_id) or {}).get("last_heartbeat_ms"), 10,
                     what="the broker's first heartbeat")
    return wait_for(lambda: (lambda r: r if r["last_heartbeat_ms"] > first + for_ms else None)(
        _registration(cluster, broker_id)), for_ms / 1000 + 10, interval=0.1, what="heartbeats past a session")


def test_a_running_broker_keeps_its_id_and_a_killed_one_frees_it_once_its_session_lapses(short_sessions, tmp_path):
    cluster, broker_id = short_sessions, 7
    proc = _broker(tmp_path, cluster, broker_id).start()
    try:
        reg = _heartbeating(cluster, broker_id, SESSION_MS)
        assert proc.proc.poll() is None
        refused = _register(cluster, broker_id, uuid.uuid4())
        assert isinstance(refused, DuplicateBrokerRegistrationError), refused  # 101 while it runs
        assert _registration(cluster, broker_id)["broker_epoch"] == reg["broker_epoch"]  # not fenced

        proc.kill()  # SIGKILL by its PID: no shut-down heartbeat
        killed = time.monotonic()
        refused = _register(cluster, broker_id, uuid.uuid4())
        assert isinstance(refused, DuplicateBrokerRegistrationError), refused  # its session is still live

        # A new incarnation of the broker (the same id, restarted at once) keeps retrying the refusal and
        # comes up once the old session has lapsed.
        restarted = _broker(tmp_path, cluster, broker_id).start(timeout=SESSION_MS / 1000 + 20)
        up = time.monotonic()
        try:
            assert up - killed >= SESSION_MS / 1000 - 1.0  # not before the session lapsed (the leader's clock)
            new = _heartbeating(cluster, broker_id, 0)
            assert new["incarnation_id"] != reg["incarnation_id"] and new["broker_epoch"] > reg["broker_epoch"]
            assert "DUPLICATE_BROKER_REGISTRATION" in restarted.tail() or "DuplicateBrokerRegistration" in \
                restarted.tail()
        finally:
            restarted.kill()
    finally:
        proc.kill()


def test_a_cleanly_stopped_broker_frees_its_id_at_once(short_sessions, tmp_path):
    cluster, broker_id = short_sessions, 8
    proc = _broker(tmp_path, cluster, broker_id).start()
    try:
        _heartbeating(cluster, broker_id, INTERVAL_MS)
        refused = _register(cluster, broker_id, uuid.uuid4())
        assert isinstance(refused, DuplicateBrokerRegistrationError), refused
        proc.stop()  # SIGTERM: the broker's clean stop sends a heartbeat asking to shut down
        assert proc.proc.returncode == 0, proc.tail()
        assert _registration(cluster, broker_id) is None  # the registration is gone
        epoch = _register(cluster, broker_id, uuid.uuid4())
        assert isinstance(epoch, int), epoch  # at once, not a session later
    finally:
        proc.kill()
