"""The transaction workload of the deterministic simulation (``SimConfig(workload="transactions")``):
brokers running the real transaction coordinator, their clients and model partitions (``txn_clients``,
``txn_quorum``, ``txn_log``), the faults on top of the quorum's, and the end (everything completes,
``txn_checker`` judges).  docs/simulation.md tells the whole model."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from quorum import failpoints
from records import TransactionRequest

from .checker import Violation
from .node import SimulatedNode
from .sim import FaultPlan, SimConfig, Simulation
from .txn_checker import TxnChecker
from .txn_clients import BrokerCrash, TxnBroker, TxnClient
from .txn_quorum import ConnectionFailed, QuorumCall, serve


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
        self.txn_brokers: list[TxnBroker] = []
        self.instances: list[TxnClient] = []
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

    def arrive(self, node: SimulatedNode, call: QuorumCall, token: int) -> None:
        """A request reaches ``node``'s client port: served now, or when the node resumes (it waits in the
        socket meanwhile); a stopped node refuses the connection."""
        if not node.running:
            self.after(self.rng.uniform(0.0002, 0.002), "broker", call.answer, token,
                       ConnectionFailed(f"node {node.node_id} is down"), None)
            return
        if node.paused:
            self.txn_stats["served_after_pause"] += 1
        node.guard(self._serve_start, node, call, token)

    def _serve_start(self, node: SimulatedNode, call: QuorumCall, token: int) -> None:
        request = call.request
        if isinstance(request, TransactionRequest) and request.op == "pending":
            with node.service.lock:  # served from this node's applied state (``_pending_txns``)
                value = node.service.state.transactions.pending(int(self.clock.time() * 1000),
                                                                max(1, min(int(request.limit), 10_000)))
            self._reply(call, token, None, value)
            return
        task = node.loop.create_task(serve(self, node, call.rpc, request, False))
        task.add_done_callback(lambda t: self._served(call, token, t))
        node.wake(0.0)

    def _served(self, call: QuorumCall, token: int, task: asyncio.Task) -> None:
        if task.cancelled():
            self._reply(call, token, ConnectionFailed("the node died under the request"), None)
            return
        error = task.exception()
        self._reply(call, token, error, None if error is not None else task.result())

    def _reply(self, call: QuorumCall, token: int, error: Exception | None, value: Any) -> None:
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
                task = target.loop.create_task(serve(self, target, rpc, request, True))
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
                    raise BrokerCrash()
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
        self.txn_brokers = [TxnBroker(self, 201 + i) for i in range(2)]
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
        self.instances.append(TxnClient(self, tid, number, self.rng.choice(self.txn_brokers)))

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
