"""The producer-ID workload of the deterministic simulation (``chaos.sim.sim``): its clients.

Brokers that register, allocate blocks, re-register, start and bump transactional ids (``_Broker``);
brokers running the real ``ProducerIdManager`` against the simulated quorum (``_ManagedBroker``); and a
ZooKeeper migration seed (``Workload._seed_once``).  Each request is an ``_Op``, its acknowledged answer
checked as it arrives.  Every draw comes from the simulation's streams, in the order of its events.
"""
from __future__ import annotations

import random
import uuid
from typing import Any, Callable, Protocol

from broker.pid_manager import PidManagerConfig, ProducerIdManager
from quorum.client import api
from quorum.rpcs import RPCS
from records import InitTransactionalProducerRequest, SeedProducerIdsRequest
from records.wire.errors import CoordinatorLoadInProgressError, PidQuorumError, RequestTimedOutError

from .checker import Checker, Ranges
from .host import Host
from .loop import PumpedLoop
from .node import SimulatedNode


class ClientHost(Host, Protocol):
    """What the clients use of the simulation."""

    checker: Checker
    stats: dict[str, int]
    acked_blocks: list[tuple[int, int, int]]

    def padding(self, share: float = 0.5) -> str: ...

    def _pick(self, running: bool = True) -> SimulatedNode | None: ...


class Workload:
    """The clients a ``Simulation`` starts beyond its brokers; mixed into it, so ``self`` is the simulation
    (``chaos.sim.txn.TxnSimulation`` overrides ``_start_workload`` with its own)."""


    def _start_workload(self) -> None:
        """The clients beyond the brokers that register and allocate (a subclass runs others)."""
        if self.script is not None:
            self.script(self)
        self.after(self.rng.uniform(0.0, 0.3), "client", self._seed_once)
        self.managed = [_ManagedBroker(self, 101 + b) for b in range(self.config.managed_brokers)]

    def _seed_once(self) -> None:
        """A migration from ZooKeeper: the last ZooKeeper block is far above the cursor; the seed must make
        the quorum continue above its end (block_end is inclusive)."""
        node = self._pick()
        if node is None:
            self.after(0.5, "client", self._seed_once)
            return
        with node.service.lock:
            cursor = node.service.state.producer_ids.next_producer_id
        start = cursor + 10_000_000
        end = start + 999
        request = SeedProducerIdsRequest(next_producer_id=end + 1, origin="sim", zk_broker=99, zk_block_start=start,
                                         zk_block_end=end)
        _Op(self, request, f"seed after ZooKeeper block [{start}, {end}]", on_ok=lambda r: (
            self.checker.issue(start, end + 1, f"ZooKeeper block [{start}, {end}] (seeded)") if r[0] else None))


class _Op:
    """One client request: sent to a node, retried on another after a definite refusal, until its deadline.
    ``ok`` answers are checked at once; a timeout or a node dying under it is an unknown outcome.  The
    request is the one a client sends (a Kafka request entity, or a record RPC's request record); its RPC
    is looked up in the quorum's table and handed to the node's proposer."""

    def __init__(self, sim: ClientHost, request: Any, what: str, on_ok: Callable[[Any], None],
                 on_done: Callable[[], None] | None = None, deadline: float = 6.0,
                 on_error: Callable[[Exception], None] | None = None):
        self.sim, self.request, self.what = sim, request, what
        self.rpc = RPCS.of_request(request)
        self.on_ok, self.on_done, self.on_error = on_ok, on_done, on_error
        self.deadline = sim.clock.now + deadline
        self.finished = False
        sim.stats["ops"] += 1
        self._try()

    def _try(self) -> None:
        sim = self.sim
        if sim.clock.now >= self.deadline:
            self._end("unknown")
            return
        node = sim._pick()
        if node is None or node.proposer is None:
            sim.after(0.1, "client", self._try)
            return
        task = node.loop.create_task(node.proposer.submit(self.rpc, self.request,
                                                          min(2.0, self.deadline - sim.clock.now)))
        task.add_done_callback(lambda t, _n=node: self._answered(t, _n))
        node.wake(0.0)

    def _answered(self, task, node) -> None:
        if self.finished:
            return
        if task.cancelled():
            self._end("unknown")  # the node died under it: may or may not be committed
            return
        err = task.exception()
        if err is None:
            self.sim.note(f"client: {self.what}: ok {task.result()!r} (node {node.node_id})")
            self.finished = True
            self.sim.stats["acked"] += 1
            self.on_ok(task.result())
            if self.on_done:
                self.on_done()
            return
        if isinstance(err, PidQuorumError) and type(err).__name__ in ("NotControllerError", "StaleBrokerEpochError",
                                                                         "InvalidRequestError"):
            if type(err).__name__ == "NotControllerError":
                self.sim.after(self.sim.rng.uniform(0.02, 0.2), "client", self._try)
                return
            self._end(f"refused: {err}", err)
            return
        self._end("unknown")

    def _end(self, how: str, err: Exception | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        if how == "unknown":
            self.sim.stats["unknown"] += 1
        self.sim.note(f"client: {self.what}: {how}")
        if self.on_error:
            self.on_error(err or RequestTimedOutError(f"{self.what}: outcome unknown"))
        if self.on_done:
            self.on_done()


class _Broker:
    """A broker: registers, allocates blocks, sometimes re-registers, starts and bumps transactional ids."""

    def __init__(self, sim: ClientHost, broker_id: int):
        self.sim = sim
        self.broker_id = broker_id
        self.epoch: int | None = None
        self.busy = False
        self.txn: dict[str, tuple[int, int]] = {}
        self.tids: dict[int, str] = {}

    def act(self) -> None:
        sim = self.sim
        if not self.busy:
            self.busy = True
            roll = sim.rng.random()
            if self.epoch is None or roll < 0.03:
                incarnation = sim.new_id()
                _Op(sim, api.registration_request(self.broker_id, uuid.UUID(incarnation),
                                                f"broker-{self.broker_id}{sim.padding()}:9092"),
                    f"broker {self.broker_id} registers", on_ok=self._registered, on_done=self._idle)
            elif roll < 0.12:
                tid = self._tid(sim.rng.randint(0, 2))
                pid, epoch = self.txn.get(tid, (-1, -1))
                _Op(sim, InitTransactionalProducerRequest(
                        broker_id=self.broker_id, broker_epoch=self.epoch, transactional_id=tid,
                        transaction_timeout_ms=60_000, producer_id=pid, producer_epoch=epoch),
                    f"broker {self.broker_id} InitProducerId({tid})",
                    on_ok=lambda r, _t=tid: self._txn(_t, r), on_done=self._idle)
            else:
                epoch = self.epoch
                _Op(sim, api.allocate_request(self.broker_id, epoch),
                    f"broker {self.broker_id} allocates", on_ok=self._allocated, on_done=self._idle)
        sim.after(sim.rng.expovariate(8.0), "client", self.act)

    def _tid(self, k: int) -> str:
        """The broker's k-th transactional id (a few KiB long in some seeds: always the same for one k)."""
        if k not in self.tids:
            self.tids[k] = f"txn-{self.broker_id}-{k}{self.sim.padding(0.4)}"
        return self.tids[k]

    def _idle(self) -> None:
        self.busy = False

    def _registered(self, epoch) -> None:
        self.epoch = epoch

    def _allocated(self, block) -> None:
        start, length = block
        self.sim.checker.issue(start, start + length, f"block of broker {self.broker_id}")
        self.sim.acked_blocks.append((self.broker_id, start, start + length))

    def _txn(self, tid: str, result) -> None:
        pid, epoch = result[:2]  # (producer id, epoch, pending transaction): the simulation opens none
        self.sim.checker.txn_init(tid, pid, epoch, f"InitProducerId of broker {self.broker_id}")
        self.txn[tid] = (pid, epoch)


class _Block:
    def __init__(self, start: int, length: int):
        self.start, self.length, self.throttle_ms = start, length, 0


class _SimQuorum:
    """The ``PidQuorum`` a managed broker's ``ProducerIdManager`` uses: requests to the simulated quorum,
    answered on the broker's own loop.  With the "bad answer" fault it delivers, once, a block shifted to
    start at the broker's last held ID (a controller off by one: the input KAFKA-20031's guard exists for)."""

    def __init__(self, sim: ClientHost, broker: "_ManagedBroker"):
        self.sim, self.broker = sim, broker

    def _call(self, request: Any, what: str, shape: Callable[[Any], Any]):
        fut = self.broker.loop.create_future()

        def ok(result):
            if not fut.done():
                fut.set_result(shape(result))
            self.broker.wake()

        def error(err):
            if not fut.done():
                fut.set_exception(err)
            self.broker.wake()
        _Op(self.sim, request, what, on_ok=ok, on_error=error)
        return fut

    async def register_broker(self, broker_id, incarnation_id=None, listener=""):
        request = api.registration_request(broker_id, uuid.UUID(self.sim.new_id()), f"managed-{broker_id}:9092")
        return await self._call(request, f"managed broker {broker_id} registers", lambda epoch: epoch)

    async def allocate(self, broker_id, broker_epoch):
        def shape(block):
            start, length = block
            self.sim.checker.issue(start, start + length, f"block of managed broker {broker_id}")
            self.broker.acked.add(start, start + length, "acked")
            last = self.broker.manager._last_accepted_end
            if self.broker.bad_answer and last is not None:
                self.broker.bad_answer = False
                self.sim.note(f"managed broker {broker_id}: the answer [{start}, +{length}) arrives as "
                              f"[{last - 1}, +{length}) (bad answer)")
                return _Block(last - 1, length)
            return _Block(start, length)
        return await self._call(api.allocate_request(broker_id, broker_epoch), f"managed broker {broker_id} allocates", shape)


class _ManagedBroker:
    """A broker running the real ``broker.pid_manager.ProducerIdManager`` (prefetch, re-registration, block
    validation) against the simulated quorum; producers ask it for IDs, and every ID it hands out must be
    new and inside a block the quorum acknowledged to it."""

    def __init__(self, sim: ClientHost, broker_id: int):
        self.sim, self.broker_id = sim, broker_id
        self.runner = PumpedLoop(sim)
        self.loop = self.runner.loop
        self.acked = Ranges()
        self.bad_answer = False
        self.manager = ProducerIdManager(broker_id, _SimQuorum(sim, self), clock=sim.clock.monotonic,
                                         rng=random.Random(sim.rng.getrandbits(64)),
                                         config=PidManagerConfig(start_timeout_s=3600.0))
        self.runner.spawn(self.manager.start())
        sim.after(sim.rng.uniform(0.5, 1.5), "client", self.produce)

    def wake(self) -> None:
        """Run the broker's loop when it next has work."""
        self.runner.wake()

    def produce(self) -> None:
        for _ in range(self.sim.rng.randint(1, 20)):
            try:
                pid = self.manager.generate_producer_id()
            except (CoordinatorLoadInProgressError, PidQuorumError):
                break
            self.sim.checker.hand_out(self.broker_id, pid, self.acked)
        self.loop.pump()
        self.wake()
        self.sim.after(self.sim.rng.expovariate(20.0), "client", self.produce)

    def close(self) -> None:
        self.runner.shut()


__all__ = ["Workload"]
