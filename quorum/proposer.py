"""The leader's proposer: requests in batches, one log entry per batch, answered from replay.

Exactly one entry is in flight at a time, so each batch is generated from a state that includes every
earlier batch.  Whenever leadership is new, or a proposal's outcome is unknown, the proposer first
commits an empty barrier entry: once it is applied, every entry before it is applied too, so generation
never reads a state older than the log.  A retry after an unknown outcome is generated afresh: at worst
a block is wasted, never issued twice.  Replay is the last guard: it refuses any block below the cursor.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from quorum.client.retry import result_within
from records import Record, encode_batch
from records.wire.errors import NotControllerError, PidQuorumError, RequestTimedOutError, UnknownServerError

from .managers import Context, TxnSettings
from .producer_ids import Generate, ProducerIdController, bridge_reservation
from .raft import ProposalRejected, ProposalUnknown

log = logging.getLogger(__name__)

# Batching (see Proposer._linger): brokers that had a request in one of the last
# LINGER_HISTORY_BATCHES batches are waited for, at most LINGER_MAX_S.
LINGER_MAX_S = 0.002
LINGER_HISTORY_BATCHES = 8


@dataclass
class Proposal:
    """One request in the proposer's queue: its handler bound to its request, and whose it is."""
    generate: Generate
    broker_id: int | None  # the requesting broker, if any (lingering waits for the recently active ones)
    future: asyncio.Future = field(repr=False)
    on_value: Callable[[Any], None] | None = field(default=None, repr=False)  # see Proposer.enqueue

    def finish(self, response: Any = None, error: PidQuorumError | None = None) -> None:
        if self.future.done():
            return  # the caller gave up (deadline)
        if error is not None:
            self.future.set_exception(error)
            return
        if self.on_value is not None:
            self.on_value(response)
        self.future.set_result(response)


class Proposer:
    """On the leader: queued requests in batches, generated against a scratch fork of the applied state,
    proposed as one log entry, each answered from what replay made of its records.  ``service`` is the
    node's ``Service``: its Raft node, applied state (under its lock), clock and config.  The producer-ID
    controller proposes through it (``producer_ids``)."""

    def __init__(self, service: Any):
        self.service = service
        self.producer_ids = ProducerIdController(service, self)
        self.queue: asyncio.Queue[Proposal] = asyncio.Queue()
        self.barrier_term: int | None = None
        self.batches = 0
        self.proposed_records = 0
        self.linger_max_s = LINGER_MAX_S
        self._recent_brokers: collections.deque[set] = collections.deque(maxlen=LINGER_HISTORY_BATCHES)
        self._last_round_s = 0.0

    def enqueue(self, generate: Generate, broker_id: int | None,
                on_value: Callable[[Any], None] | None = None) -> asyncio.Future:
        """Queue ``generate`` for the next batch; the future resolves to its value once its records are
        applied here.  ``on_value`` (which must not raise) is called with that value where the entry is
        applied: in the tick, before the future's waiters resume a pass of the event loop later.  The
        server writes the answer there (``QuorumServer._answer``)."""
        fut = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(Proposal(generate, broker_id, fut, on_value))
        return fut

    @staticmethod
    async def wait(future: asyncio.Future, timeout: float) -> Any:
        try:
            return await result_within(future, timeout)
        except asyncio.TimeoutError:
            raise RequestTimedOutError(f"not committed within {timeout:.2f}s") from None

    async def submit(self, rpc: Any, request: Any, timeout: float,
                     on_value: Callable[[Any], None] | None = None) -> Any:
        """The leader's side of a proposed RPC: its controller's path (``rpc.submit``: AllocateProducerIds,
        MigrationCommand), else ``rpc.generate``'s records for ``request`` proposed as they are; its value
        once applied (see ``enqueue``)."""
        if rpc.submit is not None:
            return await rpc.submit(self, request, timeout, on_value)
        broker_id = getattr(request, "broker_id", None)
        generate = rpc.generate
        fut = self.enqueue(lambda state, ctx: generate(state, request, ctx),
                           None if broker_id is None else int(broker_id), on_value)
        return await self.wait(fut, timeout)

    async def _propose(self, payload: bytes, timeout: float,
                       on_applied: Callable[[Any], None] | None = None,
                       proposed: Callable[[], None] | None = None) -> Any:
        """Propose ``payload``; its apply's outcome once applied.  ``on_applied`` runs with that outcome where
        the entry is applied (in the tick, on the loop that drives Raft), before this returns, and never after
        the deadline passed: the requests it answers resume a pass of the loop earlier than if this
        coroutine answered them once it resumes.  ``proposed`` (which must not raise) runs once the entry
        was handed to Raft (on the leader its AppendEntries are sent by then): work for the wait."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        here = threading.get_ident()

        def done(result, error):
            def settle():
                if fut.done():
                    return
                if error is not None:
                    fut.set_exception(error)
                    return
                if on_applied is not None:
                    try:
                        on_applied(result)
                    except Exception as e:  # noqa: BLE001 - not the tick's failure: this batch's requests'
                        log.exception("answering an applied batch failed")
                        fut.set_exception(e)
                        return
                fut.set_result(result)
            if threading.get_ident() == here:
                settle()  # the loop drives Raft (a node process): the outcome is settled in the tick
            else:
                loop.call_soon_threadsafe(settle)

        self.service.raft.propose(payload, done)
        if proposed is not None:
            proposed()
        try:
            return await result_within(fut, timeout)
        except asyncio.TimeoutError:
            raise ProposalUnknown(f"not applied within {timeout:.2f}s") from None

    async def run(self) -> None:
        max_batch = self.service.cfg.max_batch
        loop = asyncio.get_running_loop()
        while True:
            ops = [await self.queue.get()]
            while len(ops) < max_batch and not self.queue.empty():
                ops.append(self.queue.get_nowait())
            await self._linger(ops, max_batch, loop)
            self._recent_brokers.append({op.broker_id for op in ops} - {None})
            ops = [op for op in ops if not op.future.done()]
            if ops:
                t0 = loop.time()
                await self._run_batch(ops)
                self._last_round_s = loop.time() - t0

    async def _linger(self, ops: list[Proposal], max_batch: int, loop: asyncio.AbstractEventLoop) -> None:
        """Wait briefly for the requests of the brokers seen in the last few batches that are not queued yet.

        One entry is in flight at a time, so the requests answered together come back together:
        without this, the first to return is proposed alone and the others wait a whole round
        (three busy brokers gave 1.5 records per entry).  The wait ends as soon as every recently
        active broker has a request queued, and never exceeds LINGER_MAX_S or half of the last
        round: a lone broker (sequential allocations) never waits.
        """
        active = set().union(*self._recent_brokers) if self._recent_brokers else set()
        expected = len(active)
        if len(ops) >= expected or self.linger_max_s <= 0:
            return
        queued = {op.broker_id for op in ops}
        deadline = loop.time() + min(self.linger_max_s, self._last_round_s / 2)
        while len(ops) < max_batch and not active <= queued:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                op = await asyncio.wait_for(self.queue.get(), remaining)
            except asyncio.TimeoutError:
                return
            ops.append(op)
            queued.add(op.broker_id)
            while len(ops) < max_batch and not self.queue.empty():
                op = self.queue.get_nowait()
                ops.append(op)
                queued.add(op.broker_id)

    async def _run_batch(self, ops: list[Proposal]) -> None:
        svc = self.service
        timeout = svc.cfg.request_timeout_ms / 1000
        is_leader, _, term = svc.raft.role()
        if not is_leader:
            for op in ops:
                op.finish(error=NotControllerError("this node is not the leader"))
            return
        if self.barrier_term != term:
            try:
                await self._propose(encode_batch([]), timeout)
                self.barrier_term = term
            except (ProposalRejected, ProposalUnknown) as e:
                self.barrier_term = None
                for op in ops:
                    op.finish(error=NotControllerError(f"leadership not established: {e}"))
                return
        if not self._still_leading(term, ops):
            return
        ctx = Context(svc.cfg.block_size, int(svc.clock.time() * 1000),
                      TxnSettings(svc.cfg.transactional_id_expiration_ms, svc.cfg.transaction_max_timeout_ms),
                      session_timeout_ms=svc.cfg.broker_session_timeout_ms)
        with svc.lock:
            scratch = svc.state.fork()
        records: list[Record] = []
        spans: list[tuple[Proposal, int, int, Any]] = []
        for op in ops:
            try:
                reservation = await bridge_reservation(svc.zookeeper, op.generate, op.broker_id, scratch, ctx)
                if reservation is not None:
                    scratch.apply_batch([reservation])
                    records.append(reservation)
                result = op.generate(scratch, ctx)
            except PidQuorumError as e:
                op.finish(error=e)
                continue
            refused = [o for o in scratch.apply_batch(result.records) if not o.accepted]
            if refused:  # generate and replay disagree: a bug, never propose it
                log.error("generated records refused by replay: %s", refused)
                op.finish(error=UnknownServerError(f"internal error: {refused[0].error}"))
                continue
            spans.append((op, len(records), len(result.records), result.response))
            records.extend(result.records)
        if not spans or not self._still_leading(term, [op for op, *_ in spans]):
            return
        try:
            await self._propose(encode_batch(records), timeout, lambda errors: self._answer(spans, records, errors),
                                lambda: self._prepare(spans))
        except ProposalRejected as e:
            for op, *_ in spans:
                op.finish(error=NotControllerError(f"not committed: {e}"))
        except ProposalUnknown as e:
            self.barrier_term = None  # the next batch must see this entry applied (or discarded) first
            for op, *_ in spans:
                op.finish(error=RequestTimedOutError(f"outcome unknown: {e}"))
        except Exception as e:  # noqa: BLE001 - answering failed (logged): no request is left waiting
            for op, *_ in spans:
                op.finish(error=UnknownServerError(f"internal error: {type(e).__name__}: {e}"))

    def _still_leading(self, term: int, ops: list[Proposal]) -> bool:
        """After a wait (the barrier, a ZooKeeper reservation): is this node still the leader of ``term``?  A
        batch is generated from this node's applied state, which is the cluster's only while it leads in
        the term whose barrier it applied; otherwise its requests are refused (definite: nothing was
        proposed) and retried where the leader is."""
        is_leader, _, now = self.service.raft.role()
        if is_leader and now == term:
            return True
        self.barrier_term = None
        for op in ops:
            op.finish(error=NotControllerError(f"leadership of term {term} lost while the batch was prepared"))
        return False

    @staticmethod
    def _prepare(spans: list[tuple[Proposal, int, int, Any]]) -> None:
        """While the batch's entry is on its way: each request's answer, encoded for the value it will have
        if its records are applied as generated (``QuorumServer``'s ``EarlyAnswer``)."""
        for op, _, _, response in spans:
            prepare = getattr(op.on_value, "prepare", None)
            if prepare is not None and not op.future.done():
                prepare(response)

    def _answer(self, spans: list[tuple[Proposal, int, int, Any]], records: list[Record], errors: Any) -> None:
        """The batch's entry is applied: answer each request from its records' outcomes at replay."""
        self.batches += 1
        self.proposed_records += len(records)
        for op, start, n, response in spans:
            mine = errors[start:start + n] if isinstance(errors, list) and len(errors) == len(records) else ["bad"]
            failed = [e for e in mine if e is not None]
            if failed:
                self.barrier_term = None
                op.finish(error=NotControllerError(f"refused at replay, retry: {failed[0]}"))
            else:
                op.finish(response)


__all__ = ["LINGER_HISTORY_BATCHES", "LINGER_MAX_S", "Proposal", "Proposer"]
