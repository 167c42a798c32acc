"""The brokers and the clients of the transaction workload: a broker runs the real ``TxnCoordinator``
(``broker.txn_coordinator``) and its sweeper on its own loop over ``TxnQuorum``; a client
(``TxnClient``, one or more per transactional id) runs InitProducerId, AddPartitionsToTxn, produce
(KIP-890), EndTxn, with retries, on the broker it talks to."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Protocol

from broker.txn_coordinator import TxnCoordinator
from records.wire.errors import Errors, PidQuorumError, RequestTimedOutError, for_code

from .loop import PumpedLoop
from .txn_checker import ClientTxn
from .txn_log import ModelStorage
from .txn_quorum import QuorumSide, TxnQuorum

TOPIC_PARTITIONS = 3


class BrokerGone(Exception):
    """The broker a client talks to crashed under its request (the connection dropped)."""


class BrokerCrash(BaseException):
    """Raised at the ``broker.txn.prepared`` failpoint: the broker process dies there."""


class TxnHost(QuorumSide, Protocol):
    """What the brokers and the clients use of the transaction simulation."""

    sweep_interval: float
    txn_timeout_ms: int
    stall_rate: float
    txn_stopping: bool
    txn_brokers: list[TxnBroker]


class TxnBroker:
    """A broker: its partitions (durable across its crashes) and, per process, a loop, the real
    ``TxnCoordinator`` and its sweeper."""

    def __init__(self, sim: TxnHost, broker_id: int):
        self.sim, self.broker_id = sim, broker_id
        self.topic = f"t{broker_id}"
        self.storage = ModelStorage()
        self.storage.add_topic(self.topic, TOPIC_PARTITIONS)
        self.runner: PumpedLoop | None = None
        self.coordinator: TxnCoordinator | None = None
        self.epoch: int | None = None
        self.incarnation = 0
        self._boot()

    @property
    def up(self) -> bool:
        return self.runner is not None

    def _boot(self) -> None:
        if self.runner is not None:
            return
        self.incarnation += 1
        self.runner = PumpedLoop(self.sim)
        self.epoch = None
        quorum = TxnQuorum(self.sim, self.runner)

        async def run_io(fn, *args):
            return fn(*args)
        self.coordinator = TxnCoordinator(self.broker_id, quorum, self.storage, run_io, lambda: self.epoch,
                                          self._reregister, check_interval_s=self.sim.sweep_interval)
        self.quorum = quorum
        self.sim.note(f"txn broker {self.broker_id} starts (incarnation {self.incarnation})")
        self.runner.spawn(self._start())

    async def _start(self) -> None:
        await self._reregister()
        await self.coordinator.run()

    async def _reregister(self) -> None:
        while True:
            try:
                self.epoch = await self.quorum.register(self.broker_id)
                return
            except PidQuorumError:
                await asyncio.sleep(0.2)

    def crash(self, why: str) -> None:
        if self.runner is None:
            return
        self.sim.note(f"txn broker {self.broker_id} {why}")
        runner, self.runner, self.coordinator = self.runner, None, None
        runner.shut()
        for part in self.storage.all():
            part.crash()
        self.sim.after(self.sim.rng.uniform(0.2, 2.0), "broker", self._boot)

    def call(self, client_runner: PumpedLoop, make: Callable[[TxnCoordinator], Any]) -> asyncio.Future:
        """Run ``make(coordinator)`` (a coroutine) on this broker's loop; its outcome on the client's loop
        (``BrokerGone`` if the broker is down or dies under it)."""
        fut = client_runner.loop.create_future()
        if self.runner is None:
            fut.set_exception(BrokerGone(f"broker {self.broker_id} is down"))
            return fut

        def done(task: asyncio.Task) -> None:
            if fut.done():
                return
            if task.cancelled():
                fut.set_exception(BrokerGone(f"broker {self.broker_id} went away"))
            elif task.exception() is not None:
                e = task.exception()
                fut.set_exception(BrokerGone(str(e)) if isinstance(e, BrokerCrash) else e)
            else:
                fut.set_result(task.result())
            client_runner.wake()
        task = self.runner.spawn(make(self.coordinator))
        task.add_done_callback(done)
        return fut

    async def produce(self, coordinator: TxnCoordinator, tid: str, pid: int, epoch: int, partition: int,
                      value: str) -> int:
        """A Produce of one transactional record: the front end's KIP-890 check, then the append."""
        part = self.storage.partition(self.topic, partition)
        token = part.expect_transaction(pid, epoch)
        await coordinator.verify(tid, pid, epoch, self.topic, partition)
        error, message, offset = part.append(pid, epoch, value, token)
        if error != Errors.NONE:
            raise for_code(error, f"{part.name}: {message}")
        return offset


class TxnClient:
    """One producer instance of a transactional id (a KafkaProducer with ``transactional.id``)."""

    def __init__(self, sim: TxnHost, tid: str, number: int, broker: TxnBroker):
        self.sim, self.tid, self.number, self.broker = sim, tid, number, broker
        self.runner = PumpedLoop(sim)
        self.pid, self.epoch = -1, -1
        self.counter = 0
        self.fenced = False
        self.name = f"{tid}#{number}"
        self.runner.spawn(self._life())

    async def _on_broker(self, make):
        return await self.broker.call(self.runner, make)

    async def _sleep(self, lo: float, hi: float) -> None:
        await asyncio.sleep(self.sim.rng.uniform(lo, hi))

    async def _life(self) -> None:
        sim = self.sim
        expect = (-1, -1)
        await self._sleep(0.2, 1.0)
        while not sim.txn_stopping and not self.fenced:
            try:
                self.pid, self.epoch = await self._on_broker(
                    lambda c: c.init_producer_id(self.tid, sim.txn_timeout_ms, *expect))
                sim.note(f"client {self.name}: InitProducerId -> producer {self.pid} epoch {self.epoch} "
                         f"(broker {self.broker.broker_id})")
            except (PidQuorumError, BrokerGone) as e:
                if isinstance(e, PidQuorumError) and e.code in (Errors.PRODUCER_FENCED,
                                                                Errors.INVALID_PRODUCER_EPOCH):
                    self._fenced(e)
                    return
                await self._sleep(0.05, 0.5)
                continue
            while not sim.txn_stopping:
                how = await self._transaction()
                if how == "fenced":
                    return
                if how == "reinit":
                    expect = (self.pid, self.epoch)
                    break
                if sim.rng.random() < 0.08:
                    self._move()
                await self._sleep(0.0, 0.3)

    def _fenced(self, e: Exception) -> None:
        self.fenced = True
        self.sim.note(f"client {self.name}: fenced ({type(e).__name__})")

    def _move(self) -> None:
        others = [b for b in self.sim.txn_brokers if b is not self.broker]
        if others:
            self.broker = self.sim.rng.choice(others)
            self.sim.note(f"client {self.name}: moves to broker {self.broker.broker_id}")

    async def _retrying(self, make, attempts: int):
        """A step, retried on the errors a Kafka producer retries (CONCURRENT_TRANSACTIONS, timeouts, a
        coordinator loading, a dropped connection); another error is raised."""
        for i in range(attempts):
            try:
                return await self._on_broker(make)
            except BrokerGone:
                pass
            except PidQuorumError as e:
                if not e.retriable:
                    raise
            if i < attempts - 1:
                await self._sleep(0.05, 0.4)
        raise RequestTimedOutError("gave up retrying")

    async def _transaction(self) -> str:
        sim, rng = self.sim, self.sim.rng
        broker = self.broker
        parts = sorted(rng.sample(range(TOPIC_PARTITIONS), rng.randint(1, TOPIC_PARTITIONS)))
        txn = sim.txn_checker.begin(self.tid, self.name, self.pid, self.epoch, broker.topic)
        pid, epoch, tid = self.pid, self.epoch, self.tid
        sim.note(f"client {self.name}: transaction {txn.number} begins on {broker.topic} {parts}")
        try:
            await self._retrying(lambda c: c.add_partitions(tid, pid, epoch, [(broker.topic, i) for i in parts]), 4)
            for i in parts:
                for _ in range(rng.randint(1, 3)):
                    self.counter += 1
                    value = f"{self.name}.{self.counter}"
                    sim.txn_checker.sent(txn, value)
                    await self._on_broker(lambda c, _i=i, _v=value: broker.produce(c, tid, pid, epoch, _i, _v))
                    txn.acked.setdefault(f"{broker.topic}-{i}", []).append(value)
        except (PidQuorumError, BrokerGone) as e:
            sim.note(f"client {self.name}: transaction {txn.number}: {type(e).__name__}: aborting")
            return await self._end(txn, False, e)
        if rng.random() < sim.stall_rate:
            sim.note(f"client {self.name}: transaction {txn.number} stalls past its timeout")
            await asyncio.sleep(sim.txn_timeout_ms / 1000 * rng.uniform(1.2, 2.5))
        return await self._end(txn, rng.random() < 0.7, None)

    async def _end(self, txn: ClientTxn, commit: bool, cause: Exception | None) -> str:
        """EndTxn, retried; after a commit refused because the coordinator aborted the transaction on its
        timeout (INVALID_PRODUCER_ID_MAPPING), an abort.  Then the next transaction ("ok"), a new
        InitProducerId bumping the epoch ("reinit", KIP-360), or the end of a fenced instance."""
        if isinstance(cause, PidQuorumError) and cause.code == Errors.PRODUCER_FENCED:
            self._fenced(cause)
            return "fenced"
        error = await self._end_once(txn, commit)
        if error is not None and commit and isinstance(error, PidQuorumError) \
                and error.code == Errors.INVALID_PRODUCER_ID_MAPPING:
            commit = False
            error = await self._end_once(txn, False)
        if error is None:
            txn.outcome = "committed" if commit else "aborted"
            self.sim.note(f"client {self.name}: transaction {txn.number} {txn.outcome}")
            return "reinit" if cause is not None or len(txn.asks) > 1 else "ok"
        txn.outcome = "unknown"
        if isinstance(error, PidQuorumError) and error.code == Errors.PRODUCER_FENCED:
            self._fenced(error)
            return "fenced"
        return "reinit"

    async def _end_once(self, txn: ClientTxn, commit: bool) -> Exception | None:
        tid, pid, epoch = self.tid, self.pid, self.epoch
        self.sim.txn_checker.ask(txn, "commit" if commit else "abort")
        try:
            await self._retrying(lambda c: c.end(tid, pid, epoch, commit), 5)
            return None
        except (PidQuorumError, BrokerGone) as e:
            self.sim.note(f"client {self.name}: EndTxn({'commit' if commit else 'abort'}) of transaction "
                          f"{txn.number}: {type(e).__name__}")
            return e

