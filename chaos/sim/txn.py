"""The transaction workload of the deterministic simulation (``SimConfig(workload="transactions")``).

Brokers run the broker's real ``TxnCoordinator`` (``broker.txn_coordinator``) on simulated asyncio
loops, its sweeper included, over ``_TxnQuorum``: the calls the coordinator makes on its
``QuorumClient`` (``txn``, ``init_transactional_sequence``, ``pending_transactions``, registration),
each sent as the real request record (``TransactionRequest``, ``InitTransactionalProducerRequest``)
through ``_Call``, a model of ``QuorumClient._call_any``: one node at a time, a per-attempt timeout,
the next node after a timeout or a retriable answer, until the call's deadline.  On the node the
request is served as ``quorum.server.QuorumServer._run`` serves it (``_serve``): the leader proposes it
(the node's real ``Proposer``); a follower forwards it to the leader, once, and relays the answer.

Clients (``_Instance``, one or more per transactional id) run InitProducerId, AddPartitionsToTxn,
produce (KIP-890: ``expect_transaction``, ``TxnCoordinator.verify``, then the append), EndTxn commit or
abort, with retries; some stall past their transaction timeout (the sweeper aborts), some move to another
broker, a second instance fences the first.  The partitions are ``txn_log.ModelPartition`` (markers, LSO,
read_committed).

Faults on top of the quorum's (``sim.FaultPlan``): a paused node (SIGSTOP: ``SimulatedNode.pause``; the
requests that reach it wait in its socket and are served, forwarded to the leader, when it resumes: the
path by which a step reaches the quorum late), client requests duplicated or delivered late, answers
lost, a broker crash (between a transaction's prepare and its markers, or anywhere), a second client
instance.  ``txn_checker`` judges the outcome.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from quorum import failpoints
from broker.txn_coordinator import TxnCoordinator
from quorum.client import api
from quorum.rpcs import RPCS
from records import InitTransactionalProducerRequest, TransactionRequest
from records.wire.errors import (
    ConcurrentTransactionsError,
    Errors,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    for_code,
)

from .checker import Violation
from .node import SimLoop, SimulatedNode
from .sim import FaultPlan, SimConfig, Simulation
from .txn_checker import ClientTxn, TxnChecker
from .txn_log import ModelStorage

TOPIC_PARTITIONS = 3


class ConnectionFailed(PidQuorumError):
    """The node's process is gone (connection refused or reset)."""
    code = Errors.NOT_CONTROLLER  # retriable: the client tries the next node


class BrokerGone(Exception):
    """The broker a client talks to crashed under its request (the connection dropped)."""


class _BrokerCrash(BaseException):
    """Raised at the ``broker.txn.prepared`` failpoint: the broker process dies there."""


@dataclass
class TxnFaultPlan(FaultPlan):
    pause: float = 0.0             # a node SIGSTOPped for 0.3-5 s
    broker_crash: float = 0.0      # a broker process killed (its coordinator dropped, a new one starts)
    crash_after_prepare: float = 0.0  # probability a completion kills its broker between prepare and markers
    fence: float = 0.0             # a second instance of a transactional id (InitProducerId, no expectation)
    client_duplicate: float = 0.0  # probability a request to a node arrives twice (the copy later)
    client_late: float = 0.0       # probability a request to a node arrives late (after its attempt timed out)
    answer_loss: float = 0.0       # probability a node's answer to a broker is lost

    @classmethod
    def extend(cls, base: FaultPlan, rng, faults: bool) -> "TxnFaultPlan":
        plan = cls(**vars(base))
        if not faults:
            return plan

        def rate(p_on: float, lo: float, hi: float) -> float:
            return rng.uniform(lo, hi) if rng.random() < p_on else 0.0
        plan.pause = rate(0.8, 0.1, 0.6)
        plan.broker_crash = rate(0.5, 0.02, 0.15)
        plan.crash_after_prepare = rate(0.4, 0.02, 0.2)
        plan.fence = rate(0.5, 0.02, 0.2)
        plan.client_duplicate = rate(0.5, 0.01, 0.08)
        plan.client_late = rate(0.5, 0.01, 0.08)
        plan.answer_loss = rate(0.5, 0.01, 0.08)
        return plan


# ----------------------------------------------------------------- loops
class _Runner:
    """A simulated asyncio loop pumped by the simulation when it has work (``_ManagedBroker``'s way)."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.loop = SimLoop(sim.clock)
        self._next: float | None = None
        self.closed = False
        self.frozen = False

    def wake(self) -> None:
        if self.closed:
            return
        loop, now = self.loop, self.sim.clock.now
        when = now if loop._ready else (loop._scheduled[0]._when if loop._scheduled else None)
        if when is not None and (self._next is None or when < self._next):
            self._next = max(when, now)
            self.sim.schedule(self._next, "broker", self._pump, self._next)

    def freeze(self, frozen: bool) -> None:
        """Hold the loop (nothing of it runs) while the quorum converges; then let it go on."""
        self.frozen = frozen
        if not frozen:
            self._next = None
            self.wake()

    def _pump(self, at: float) -> None:
        if self._next != at or self.closed or self.frozen:
            return
        self._next = None
        self.loop.pump()
        self.wake()

    def spawn(self, coro) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self.wake()
        return task

    def shut(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.shut()


# ------------------------------------------------------- the quorum side
async def _serve(sim: "TxnSimulation", node: SimulatedNode, rpc, request, forwarded: bool) -> Any:
    """``QuorumServer._run`` for one request on ``node``: the leader proposes it; a follower forwards it to
    the leader (once: a forwarded request is never forwarded again) every 20 ms until the node's request
    timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + node.cfg.request_timeout_ms / 1000
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise RequestTimedOutError(f"no leader committed the request within {node.cfg.request_timeout_ms} ms")
        is_leader, leader, _ = node.raft.role()
        if is_leader:
            return await node.proposer.submit(rpc, request, remaining)
        if forwarded:
            raise NotControllerError("not the leader (forwarded request)")
        target = sim.node_at(leader) if leader else None
        if target is not None and target is not node:
            try:
                return await sim.forward(node, target, rpc, request, remaining)
            except asyncio.TimeoutError:
                pass
            except PidQuorumError as e:
                if e.code not in (Errors.NOT_CONTROLLER, Errors.REQUEST_TIMED_OUT):
                    raise
        await asyncio.sleep(0.02)


class _Call:
    """One call of a broker's ``QuorumClient`` (``_call_any``): an attempt per node in turn, each bounded
    by the attempt timeout, the next node after a timeout, a dropped connection or a retriable answer
    (CONCURRENT_TRANSACTIONS is the Kafka client's to retry, so it is raised), a pause after each round,
    until the call's deadline.  ``done(error, value)`` is called once."""

    def __init__(self, sim: "TxnSimulation", request: Any, what: str, done: Callable[[Exception | None, Any], None]):
        self.sim, self.request, self.what, self.done = sim, request, what, done
        self.rpc = RPCS.of_request(request)
        self.deadline = sim.clock.now + sim.call_timeout
        self.attempt = 0
        self.finished = False
        self.first = sim.rng.randrange(1000)
        sim.txn_stats["calls"] += 1
        self._try()

    def _try(self) -> None:
        sim = self.sim
        if self.finished:
            return
        if sim.clock.now >= self.deadline:
            self._finish(RequestTimedOutError(f"{self.what}: no node answered in time"), None)
            return
        nodes = [n for n in sim.nodes.values() if not n.removed]
        node = nodes[(self.first + self.attempt) % len(nodes)]
        self.attempt += 1
        token = self.attempt
        plan = sim.plan
        delay = sim.rng.uniform(0.0002, 0.003)
        if sim.rng.random() < plan.client_late:
            delay += sim.rng.uniform(sim.attempt_timeout, sim.attempt_timeout + 4.0)
            sim.txn_stats["late_requests"] += 1
        sim.after(delay, "broker", sim.arrive, node, self, token)
        if sim.rng.random() < plan.client_duplicate:
            sim.txn_stats["duplicated_requests"] += 1
            sim.after(delay + sim.rng.uniform(0.0, 4.0), "broker", sim.arrive, node, self, token)
        sim.after(min(sim.attempt_timeout, max(self.deadline - sim.clock.now, 0.01)), "broker", self._timeout, token)

    def _timeout(self, token: int) -> None:
        if not self.finished and token == self.attempt:
            self._next()

    def _next(self) -> None:
        n = len([x for x in self.sim.nodes.values() if not x.removed])
        pause = self.sim.rng.uniform(0.01, 0.1) if self.attempt % n == 0 else 0.0
        self.sim.after(pause, "broker", self._try)

    def answer(self, token: int, error: Exception | None, value: Any) -> None:
        if self.finished or token != self.attempt:
            return  # an answer to an attempt the client gave up on: its waiter is gone
        if error is None:
            self._finish(None, value)
        elif isinstance(error, PidQuorumError) and error.retriable and error.code != Errors.CONCURRENT_TRANSACTIONS:
            self._next()
        else:
            self._finish(error, None)

    def _finish(self, error: Exception | None, value: Any) -> None:
        self.finished = True
        if error is not None:
            self.sim.note(f"quorum call: {self.what}: {type(error).__name__}")
        self.done(error, value)


class _TxnQuorum:
    """What ``TxnCoordinator`` calls on its ``QuorumClient``, answered through the simulated quorum on the
    broker's loop."""

    def __init__(self, sim: "TxnSimulation", broker: "_TxnBroker"):
        self.sim, self.broker = sim, broker
        self.runner = broker.runner

    def _call(self, request: Any, what: str, shape: Callable[[Any], Any]) -> asyncio.Future:
        runner = self.runner
        fut = runner.loop.create_future()

        def done(error, value):
            if runner.closed or fut.done():
                return
            if error is None:
                try:
                    fut.set_result(shape(value))
                except Exception as e:  # noqa: BLE001 - an answer that is an error (InitProducerId's)
                    fut.set_exception(e)
            else:
                fut.set_exception(error)
            runner.wake()
        _Call(self.sim, request, what, done)
        return fut

    async def register(self, broker_id: int) -> int:
        request = api.registration_request(broker_id, uuid.UUID(self.sim.new_id()), f"txn-broker-{broker_id}:9092")
        return await self._call(request, f"broker {broker_id} registers", lambda epoch: epoch)

    async def txn(self, broker_id, broker_epoch, op, transactional_id="", producer_id=-1, producer_epoch=-1,
                  partitions=None, start_time_ms=-1, sequence=-1) -> dict:
        request = TransactionRequest(broker_id=broker_id, broker_epoch=broker_epoch, op=op,
                                     transactional_id=transactional_id, producer_id=producer_id,
                                     producer_epoch=producer_epoch, partitions=json.dumps(partitions or []),
                                     start_time_ms=start_time_ms, sequence=sequence)
        return await self._call(request, f"broker {broker_id} {op}({transactional_id}, seq {sequence})",
                                lambda v: json.loads(json.dumps(v)))

    async def init_transactional_sequence(self, broker_id, broker_epoch, transactional_id, transaction_timeout_ms,
                                          producer_id=-1, producer_epoch=-1, request_id="") -> tuple[int, int, int]:
        fields = dict(broker_id=broker_id, broker_epoch=broker_epoch, transactional_id=transactional_id,
                      transaction_timeout_ms=transaction_timeout_ms, producer_id=producer_id,
                      producer_epoch=producer_epoch)
        if request_id:  # the request names itself (a copy applied again is answered as it was)
            fields["request_id"] = request_id
        request = InitTransactionalProducerRequest(**fields)

        def shape(r):
            if r[2] is not None:
                raise ConcurrentTransactionsError(f"the transaction of producer {r[0]} is {r[2].state}")
            self.sim.txn_checker.producer_id(transactional_id, r[0])
            return int(r[0]), int(r[1]), int(r[3])
        return await self._call(request, f"broker {broker_id} InitProducerId({transactional_id})", shape)

    async def pending_transactions(self, broker_id: int, limit: int = 100) -> list[dict]:
        request = TransactionRequest(broker_id=broker_id, broker_epoch=-1, op="pending", limit=limit)
        return await self._call(request, f"broker {broker_id} pending", lambda v: json.loads(json.dumps(v)))


# ------------------------------------------------------------- brokers
class _TxnBroker:
    """A broker: its partitions (durable across its crashes) and, per process, a loop, the real
    ``TxnCoordinator`` and its sweeper."""

    def __init__(self, sim: "TxnSimulation", broker_id: int):
        self.sim, self.broker_id = sim, broker_id
        self.topic = f"t{broker_id}"
        self.storage = ModelStorage()
        self.storage.add_topic(self.topic, TOPIC_PARTITIONS)
        self.runner: _Runner | None = None
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
        self.runner = _Runner(self.sim)
        self.epoch = None
        quorum = _TxnQuorum(self.sim, self)

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

    def call(self, client_runner: _Runner, make: Callable[[TxnCoordinator], Any]) -> asyncio.Future:
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
                fut.set_exception(BrokerGone(str(e)) if isinstance(e, _BrokerCrash) else e)
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


# ------------------------------------------------------------- clients
class _Instance:
    """One producer instance of a transactional id (a KafkaProducer with ``transactional.id``)."""

    def __init__(self, sim: "TxnSimulation", tid: str, number: int, broker: _TxnBroker):
        self.sim, self.tid, self.number, self.broker = sim, tid, number, broker
        self.runner = _Runner(sim)
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


# ------------------------------------------------------------ the run
class TxnSimulation(Simulation):
    """The simulation with the transaction workload (see the module doc)."""

    def __init__(self, config: SimConfig):
        super().__init__(config)
        rng = self.rng
        self.plan = TxnFaultPlan.extend(self.plan, rng, config.faults)
        self.checker = self.txn_checker = TxnChecker(self)
        self.txn_timeout_ms = rng.choice([1500, 3000, 8000])
        self.sweep_interval = rng.choice([0.3, 1.0])
        self.stall_rate = rng.choice([0.0, 0.05, 0.15])
        self.attempt_timeout = rng.uniform(0.5, 2.0)
        self.call_timeout = self.attempt_timeout * rng.choice([2, 3, 5])
        self.n_ids = rng.randint(2, 5)
        self.txn_brokers: list[_TxnBroker] = []
        self.instances: list[_Instance] = []
        self._tids: dict[int, str] = {}
        self.txn_stopping = False
        self.txn_stats = {"calls": 0, "late_requests": 0, "duplicated_requests": 0, "answers_lost": 0,
                          "forwarded": 0, "served_after_pause": 0, "late_copies_ok": 0, "late_copies_refused": 0,
                          "broker_crashes": 0, "crashes_after_prepare": 0, "pauses": 0, "instances": 0}

    # ------------------------------------------------------------ plumbing
    def node_at(self, raft_address: str) -> SimulatedNode | None:
        for n in self.nodes.values():
            if n.address == raft_address and n.running:
                return n
        return None

    def leader(self) -> SimulatedNode | None:
        for n in self.running():
            if not n.paused and n.raft.is_leader:
                return n
        return super().leader()

    def arrive(self, node: SimulatedNode, call: _Call, token: int) -> None:
        """A request reaches ``node``'s client port: served now, or when the node resumes (it waits in the
        socket meanwhile); a stopped node refuses the connection."""
        if not node.running:
            self.after(self.rng.uniform(0.0002, 0.002), "broker", call.answer, token,
                       ConnectionFailed(f"node {node.node_id} is down"), None)
            return
        if node.paused:
            self.txn_stats["served_after_pause"] += 1
        node.guard(self._serve_start, node, call, token)

    def _serve_start(self, node: SimulatedNode, call: _Call, token: int) -> None:
        request = call.request
        if isinstance(request, TransactionRequest) and request.op == "pending":
            with node.service.lock:  # served from this node's applied state (``_pending_txns``)
                value = node.service.state.transactions.pending(int(self.clock.time() * 1000),
                                                                max(1, min(int(request.limit), 10_000)))
            self._reply(call, token, None, value)
            return
        task = node.loop.create_task(_serve(self, node, call.rpc, request, False))
        task.add_done_callback(lambda t: self._served(call, token, t))
        node.wake(0.0)

    def _served(self, call: _Call, token: int, task: asyncio.Task) -> None:
        if task.cancelled():
            self._reply(call, token, ConnectionFailed("the node died under the request"), None)
            return
        error = task.exception()
        self._reply(call, token, error, None if error is not None else task.result())

    def _reply(self, call: _Call, token: int, error: Exception | None, value: Any) -> None:
        if call.finished or token != call.attempt:
            if isinstance(call.request, TransactionRequest) and call.request.op not in ("pending", "describe"):
                key = "late_copies_ok" if error is None else "late_copies_refused"
                self.txn_stats[key] += 1
                self.note(f"late copy of {call.what}: {'applied' if error is None else type(error).__name__}")
        if self.rng.random() < self.plan.answer_loss:
            self.txn_stats["answers_lost"] += 1
            return
        self.after(self.rng.uniform(0.0002, 0.003), "broker", call.answer, token, error, value)

    def forward(self, node: SimulatedNode, target: SimulatedNode, rpc, request, timeout: float) -> Any:
        """``QuorumServer._forward``: the request to the leader's client port; its answer relayed."""
        loop = node.loop
        fut = loop.create_future()
        self.txn_stats["forwarded"] += 1

        def settle(error, value):
            if fut.done() or node.loop is not loop:
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)
            node.wake(0.0)

        def back(error, value):
            self.after(self.rng.uniform(0.0002, 0.002), "broker", lambda: node.guard(settle, error, value))

        def at_target():
            if not target.running:
                back(ConnectionFailed("leader is down"), None)
                return

            def start():
                task = target.loop.create_task(_serve(self, target, rpc, request, True))
                task.add_done_callback(lambda t: back(ConnectionFailed("gone") if t.cancelled() else t.exception(),
                                                      None if t.cancelled() or t.exception() else t.result()))
                target.wake(0.0)
            target.guard(start)
        self.after(self.rng.uniform(0.0002, 0.002), "broker", at_target)
        return asyncio.wait_for(fut, timeout)

    # ------------------------------------------------------------------ run
    def run(self):
        def prepared(tid, state):
            loop = asyncio.get_running_loop()
            for b in self.txn_brokers:
                if b.runner is not None and b.runner.loop is loop and self.rng.random() < self.plan.crash_after_prepare:
                    self.txn_stats["crashes_after_prepare"] += 1
                    self.after(0.0, "broker", b.crash, f"crashes after {tid}'s {state}, before its markers")
                    raise _BrokerCrash()
            return None
        failpoints.arm("broker.txn.prepared", prepared)
        try:
            return super().run()
        finally:
            failpoints.disarm("broker.txn.prepared")
            for b in self.txn_brokers:
                if b.runner is not None:
                    b.runner.shut()
            for i in self.instances:
                i.runner.shut()

    def _start_workload(self) -> None:
        self.txn_brokers = [_TxnBroker(self, 201 + i) for i in range(2)]
        for i in range(self.n_ids):
            self._new_instance(self._tid(i))
        self.after(1.0, "client", self._sample)

    def _tid(self, i: int) -> str:
        """The i-th transactional id: a few KiB long in some seeds (``Simulation.padding``), always the same."""
        if i not in self._tids:
            self._tids[i] = f"tx-{i}{self.padding(0.4)}"
        return self._tids[i]

    def _new_instance(self, tid: str) -> None:
        self.txn_stats["instances"] += 1
        number = sum(1 for i in self.instances if i.tid == tid) + 1
        self.instances.append(_Instance(self, tid, number, self.rng.choice(self.txn_brokers)))

    def _sample(self) -> None:
        self.txn_checker.sample()
        self.after(self.rng.uniform(0.2, 1.0), "client", self._sample)

    # --------------------------------------------------------------- faults
    TXN_KINDS = ("pause", "broker_crash", "fence")
    FAULT_KINDS = Simulation.FAULT_KINDS + TXN_KINDS

    def _fault_pause(self) -> None:
        pool = [n for n in self.running() if not n.paused and not n.removed]
        if not pool:
            return
        # Half the time the leader: the node a broker's request most likely waits on when it stops.
        leader = self.leader()
        n = leader if leader is not None and self.rng.random() < 0.5 else self.rng.choice(pool)
        self.fault("pause")
        self.txn_stats["pauses"] += 1
        n.pause()
        self.after(self.rng.uniform(0.3, 5.0), "heal", self._resume, n)

    def _resume(self, n: SimulatedNode) -> None:
        if n.running and n.paused:
            n.resume()

    def _fault_broker_crash(self) -> None:
        up = [b for b in self.txn_brokers if b.up]
        if up:
            self.fault("broker_crash")
            self.txn_stats["broker_crashes"] += 1
            self.rng.choice(up).crash("is killed (kill -9)")

    def _fault_fence(self) -> None:
        self.fault("fence")
        self._new_instance(self._tid(self.rng.randrange(self.n_ids)))

    def _fault_bad_answer(self) -> None:
        pass  # no managed broker here

    # ----------------------------------------------------------------- end
    def _converge(self) -> None:
        """Resume every paused node and stop the clients; the quorum converges (``Simulation._converge``);
        then every broker runs until its sweeper has completed what is prepared or timed out, and the
        checker judges the partitions."""
        for n in self.nodes.values():
            if n.running and n.paused:
                n.resume()
        self.txn_stopping = True
        self.plan.client_late = self.plan.client_duplicate = self.plan.answer_loss = 0.0
        self.plan.crash_after_prepare = 0.0
        # The brokers are held while the quorum converges (their sweepers' reads are log entries too: a
        # transaction no broker can complete would keep the log growing and hide the quorum's state).
        runners = [b.runner for b in self.txn_brokers if b.runner is not None] + [i.runner for i in self.instances]
        for r in runners:
            r.freeze(True)
        super()._converge()
        for r in runners:
            r.freeze(False)
        for b in self.txn_brokers:
            b._boot()  # a broker down at the end starts again (its restart event was a fault's)
        deadline = self.clock.now + 60.0 + 3 * self.txn_timeout_ms / 1000
        while self._events and self.clock.now < deadline:
            self._step()
            if self.step_no % 50 == 0 and self._settled():
                break
        if not self._settled():
            leader = self.leader()
            open_txns = [] if leader is None else [
                (t.transactional_id, t.state, t.sequence, t.partitions) for t in
                leader.service.state.transactions.live_txns().values()
                if t.state not in ("CompleteCommit", "CompleteAbort")]
            raise Violation(f"liveness: transactions not completed 60 simulated seconds after the faults stopped: "
                             f"{open_txns[:10]}; partitions with open transactions: "
                             f"{[part.name for b in self.txn_brokers for part in b.storage.all() if part.ongoing][:10]}")
        self.txn_checker.final()

    def _settled(self) -> bool:
        leader = self.leader()
        if leader is None:
            return False
        with leader.service.lock:
            txns = leader.service.state.transactions.live_txns()
            busy = any(t.state not in ("CompleteCommit", "CompleteAbort") for t in txns.values())
        if busy:
            return False
        return not any(part.ongoing for b in self.txn_brokers for part in b.storage.all())

    def _result(self, ok, violation, t0):
        result = super()._result(ok, violation, t0)
        result.stats.update(self.txn_checker.figures())
        result.stats["txn"] = dict(self.txn_stats)
        result.stats["plan"] = self.plan.describe()
        return result


__all__ = ["TxnSimulation", "TxnFaultPlan"]
