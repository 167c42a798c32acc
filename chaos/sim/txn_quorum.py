"""How a broker's calls reach the simulated quorum in the transaction workload: ``QuorumCall`` models
``QuorumClient._call_any`` (one node at a time, a per-attempt timeout, the next node after a timeout or a
retriable answer, until the call's deadline); ``serve`` serves a request on a node as
``quorum.server.QuorumServer._run`` does (the leader proposes it, a follower forwards it once);
``TxnQuorum`` is what ``TxnCoordinator`` calls on its ``QuorumClient``."""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Callable, Protocol

from quorum.client import api
from quorum.rpcs import RPCS
from records import InitTransactionalProducerRequest, TransactionRequest
from records.wire.errors import (
    ConcurrentTransactionsError,
    Errors,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
)

from .host import Host
from .loop import PumpedLoop
from .node import SimulatedNode
from .txn_checker import TxnChecker


class ConnectionFailed(PidQuorumError):
    """The node's process is gone (connection refused or reset)."""
    code = Errors.NOT_CONTROLLER  # retriable: the client tries the next node


class _RequestFaults(Protocol):
    client_late: float       # probability a request to a node arrives late (after its attempt timed out)
    client_duplicate: float  # probability a request to a node arrives twice (the copy later)


class QuorumSide(Host, Protocol):
    """What a broker's calls and the nodes serving them use of the transaction simulation."""

    nodes: dict[int, SimulatedNode]
    plan: _RequestFaults
    attempt_timeout: float
    call_timeout: float
    txn_stats: dict[str, int]
    txn_checker: TxnChecker

    def node_at(self, raft_address: str) -> SimulatedNode | None: ...

    def arrive(self, node: SimulatedNode, call: QuorumCall, token: int) -> None: ...

    def forward(self, node: SimulatedNode, target: SimulatedNode, rpc, request, timeout: float) -> Any: ...


async def serve(sim: QuorumSide, node: SimulatedNode, rpc, request, forwarded: bool) -> Any:
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


class QuorumCall:
    """One call of a broker's ``QuorumClient`` (``_call_any``): an attempt per node in turn, each bounded
    by the attempt timeout, the next node after a timeout, a dropped connection or a retriable answer
    (CONCURRENT_TRANSACTIONS is the Kafka client's to retry, so it is raised), a pause after each round,
    until the call's deadline.  ``done(error, value)`` is called once."""

    def __init__(self, sim: QuorumSide, request: Any, what: str, done: Callable[[Exception | None, Any], None]):
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


class TxnQuorum:
    """What ``TxnCoordinator`` calls on its ``QuorumClient``, answered through the simulated quorum on the
    broker's loop (``runner``)."""

    def __init__(self, sim: QuorumSide, runner: PumpedLoop):
        self.sim, self.runner = sim, runner

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
        QuorumCall(self.sim, request, what, done)
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

