"""The replicated service on one node: state machine host and the leader's proposer.

``Service`` owns the ``QuorumState``, applies committed entries (from
pysyncobj's thread, under a lock), writes the audit trail and turns the state
into snapshot records and back.

``Proposer`` runs on the asyncio loop.  On the leader it takes queued requests
in batches, generates their records against a scratch fork of the applied
state, proposes the batch as one log entry and answers every request from
what replay made of its records on this node.  Exactly one entry is in
flight at a time, so each batch is generated from a state that includes every
earlier batch.  Whenever leadership is new, or a proposal's outcome is
unknown, the proposer first commits an empty barrier entry: once it is
applied, every entry before it is applied too, so generation never reads a
state older than the log.  A retry after an unknown outcome is generated
afresh: at worst a block is wasted, never issued twice.  Replay is the last
guard: it refuses any block below the cursor.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from quorum import failpoints
from quorum.client import api
from quorum.client.retry import result_within
from records import AllocateProducerIdsRecord, BridgeReservationRecord, Record, RecordError, decode_batch, encode_batch
from snapshots.storage.disk import Disk
from records.wire.errors import (
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    UnknownServerError,
)

from .config import NodeConfig
from .identity import NodeIdentity
from .managers import BRIDGE, ApplyOutcome, QuorumState, Result, TxnSettings
from .raft import ProposalRejected, ProposalUnknown, RaftNode
from .reserve import BlockReserve
from .rpcs import RPCS, Context, Rpc
from .stats import AllocationCounts
from .trail import AuditWriter

log = logging.getLogger(__name__)

# Batching (see Proposer._linger): brokers that had a request in one of the last
# LINGER_HISTORY_BATCHES batches are waited for, at most LINGER_MAX_S.
LINGER_MAX_S = 0.002
LINGER_HISTORY_BATCHES = 8


class ZooKeeperHook(Protocol):
    """What bridge mode and rollback need of ZooKeeper (``quorum.migration.bridge.ZooKeeperBridge``); blocking."""

    def reserve(self, hosts: str, min_start: int, length: int, broker_id: int) -> tuple[int, int]: ...

    def reset(self) -> None: ...

    def write_placeholder(self, hosts: str, start: int, length: int) -> str: ...


class Service:
    """``disk`` is where every durable file goes (``snapshots.storage.disk``), ``clock`` what tells the time (the
    ``time`` module), ``new_id`` what draws identity ids (uuid4); tests, fault runs and the simulator
    pass their own.  ``zookeeper``: the hook bridge mode and rollback use (the process entry point
    installs ``quorum.migration.bridge.ZooKeeperBridge``); without one, both are refused."""

    def __init__(self, cfg: NodeConfig, disk: Disk | None = None, clock=time, new_id=None,
                 zookeeper: ZooKeeperHook | None = None, **raft_options):
        self.cfg = cfg
        self.zookeeper = zookeeper
        self.clock = clock  # time.time() for record timestamps, time.monotonic() for the proposer's pacing
        self.disk = disk or Disk()
        self.disk.make_dir(cfg.data_dir)
        self.lock = threading.Lock()
        self.state = QuorumState()
        self.applied_index = 0
        self.allocations = AllocationCounts()  # blocks and IDs committed per broker (counted at apply; bounded)
        self.identity = NodeIdentity.open(cfg.data_dir, cfg.secret, cfg.cluster_id, cfg.client_address,
                                          disk=self.disk, **({"new_id": new_id} if new_id else {}))
        self.audit = AuditWriter(os.path.join(cfg.data_dir, "audit.log"), self.disk)
        self.raft = RaftNode(cfg.raft_address, [peer.raft_address for peer in cfg.peers], cfg.data_dir, cfg.secret,
                             cfg.raft, on_apply=self._apply, snapshot_state=self._snapshot_state,
                             restore_state=self._restore_state, bind_addr=cfg.raft_bind, identity=self.identity,
                             disk=self.disk, clock=clock, **raft_options)

    # ---------------------------------------------- pysyncobj thread callbacks
    def _apply(self, index: int, term: int, payload: bytes) -> list[str | None]:
        try:
            records = decode_batch(payload)
        except RecordError as e:
            # Only our proposer writes entries, so this is a bug or a foreign
            # writer; every node refuses the same way and the state is unchanged.
            log.error("entry %d is not a record batch (%s); it changes nothing", index, e)
            return [str(e)]
        with self.lock:
            outcomes = self.state.apply_batch(records)
            self.applied_index = index
            registered = self.state.registrations.brokers.__contains__
            for o in outcomes:
                if o.accepted and isinstance(o.record, AllocateProducerIdsRecord):
                    self.allocations.count(o.record.broker_id, o.record.producer_id_len, registered)
        for o in outcomes:
            if not o.accepted:
                log.warning("entry %d: replay refused %s: %s", index, type(o.record).__name__, o.error)
        # Before the answer (which the entry's callback writes): a client that reads the trails once it has
        # its answer finds its block there (``pidctl blocks history``).
        self.audit.append(index, term, outcomes)
        return [o.error for o in outcomes]

    def _snapshot_state(self) -> list[Record]:
        self.audit.sync()  # the journal drops these entries after the snapshot
        with self.lock:
            return self.state.snapshot_records()

    def _restore_state(self, records: list[Record], last_index: int) -> None:
        state = QuorumState.from_records(records)
        with self.lock:
            self.state = state
            self.applied_index = last_index
        self.audit.gap(last_index)

    # --------------------------------------------------------------- reading
    def describe(self) -> dict[str, Any]:
        with self.lock:
            summary = self.state.summary()
            issued = self.state.producer_ids.history()
            applied = self.applied_index
            allocations = self.allocations.snapshot()
        snap = self.raft.snapshot_path
        return {
            "node_id": self.cfg.node_id,
            "client_address": self.cfg.client_address,
            "raft": self.raft.status(),
            "applied_index": applied,
            "state": summary,
            "producer_ids_issued": issued,  # what a ZooKeeper seed is checked against (pidctl migrate status)
            "block_size": self.cfg.block_size,
            "snapshot": _file_info(snap),
            "journal_entries": len(self.raft.journal),
            "allocations": allocations,  # since this process started (what pidquorum_allocations_total counts)
        }

    def close(self) -> None:
        self.raft.destroy()
        self.audit.close()


def _file_info(path: str) -> dict[str, Any]:
    try:
        st = os.stat(path)
        return {"path": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                "age_s": max(0.0, time.time() - st.st_mtime_ns / 1e9)}
    except FileNotFoundError:
        return {"path": os.path.abspath(path), "bytes": 0, "mtime_ns": 0, "age_s": None}


@dataclass
class Proposal:
    """One request in the proposer's queue: its handler bound to its request, and whose it is."""
    generate: Callable[[QuorumState, Context], Result]
    broker_id: int | None  # the requesting broker, if any (lingering waits for the recently active ones)
    future: asyncio.Future = field(repr=False)
    on_value: Callable[[Any], None] | None = field(default=None, repr=False)  # see Proposer.submit

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
    def __init__(self, service: Service):
        self.service = service
        self.queue: asyncio.Queue[Proposal] = asyncio.Queue()
        self.barrier_term: int | None = None
        self.batches = 0
        self.proposed_records = 0
        self.zk_reservations = 0
        self.reserve = BlockReserve(service.cfg.allocate_reserve_blocks, lambda: service.raft.role(),
                                    self._leader_state, lambda: service.clock.monotonic(), self._propose_reserve)
        self.linger_max_s = LINGER_MAX_S
        self._recent_brokers: collections.deque[set] = collections.deque(maxlen=LINGER_HISTORY_BATCHES)
        self._last_round_s = 0.0

    async def submit(self, rpc: Rpc, request: Any, timeout: float,
                     on_value: Callable[[Any], None] | None = None) -> Any:
        """Propose ``rpc``'s records for ``request`` and answer with its domain value once applied.

        ``on_value`` (which must not raise) is called with that value where the entry is applied: in
        the tick, before this coroutine resumes a pass of the event loop later.  The server writes the
        answer there (``QuorumServer._answer``).  Not with the leader-side reserve on: its bookkeeping
        of a block handed out (``BlockReserve.handed_out``) runs here first."""
        active = False
        broker_id = getattr(request, "broker_id", None)
        if rpc.from_reserve:
            forced = failpoints.hit("quorum.allocate", self.service)  # a test's broken allocator
            if forced is not None:
                return forced
            if self.reserve.size:
                block, active = await self.reserve.take(int(broker_id), int(request.broker_epoch), timeout)
                if block is not None:
                    return block
        fut = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(Proposal(lambda state, ctx: rpc.run(state, request, ctx),
                                       None if broker_id is None else int(broker_id), fut,
                                       None if rpc.from_reserve and self.reserve.size else on_value))
        try:
            result = await result_within(fut, timeout)
        except asyncio.TimeoutError:
            raise RequestTimedOutError(f"not committed within {timeout:.2f}s") from None
        if rpc.from_reserve and self.reserve.size:
            self.reserve.handed_out(int(broker_id), int(request.broker_epoch), result, active)
        return result

    def _leader_state(self, broker_id: int) -> tuple[int | None, str | None]:
        """(the broker's registered epoch or None, the migration mode), from the applied state."""
        with self.service.lock:
            reg = self.service.state.registrations.brokers.get(broker_id)
            return (reg.broker_epoch if reg is not None else None), self.service.state.migration.mode

    def _propose_reserve(self, broker_id: int, epoch: int, count: int) -> asyncio.Future:
        """Several blocks for one broker, one after the other, in one entry: [(start, length), ...]."""
        allocate = RPCS.of(api.ALLOCATE_PRODUCER_IDS, None)
        request = api.allocate_request(broker_id, epoch)

        def generate(state: QuorumState, ctx: Context) -> Result:
            tmp, records, blocks = state.fork(), [], []
            for _ in range(count):
                r = allocate.run(tmp, request, ctx)
                tmp.apply_batch(r.records)
                records += r.records
                blocks.append(r.response)
            return Result(records, blocks)
        fut = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(Proposal(generate, broker_id, fut))
        return fut

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
                if scratch.migration.mode == BRIDGE:
                    reservation = await self._reserve_in_zookeeper(op, scratch, ctx)
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

    async def _reserve_in_zookeeper(self, op: Proposal, scratch: QuorumState, ctx: Context) -> Record | None:
        """Bridge mode: reserve in the znode, *before* proposing, the IDs ``op`` is about to take.

        Reserving after committing would let a ZooKeeper-mode broker take the same range in
        between.  A reservation whose entry then fails to commit only wastes the range
        (ZooKeeper has moved past it).  Any ZooKeeper failure fails the op (retriable).
        """
        trial = op.generate(scratch.fork(), ctx)
        need = sum(r.producer_id_len for r in trial.records if isinstance(r, AllocateProducerIdsRecord))
        if need == 0:
            return None
        broker_id = -1 if op.broker_id is None else op.broker_id
        hosts, cursor = scratch.migration.zk, scratch.producer_ids.next_producer_id
        zk = self.service.zookeeper
        if zk is None:
            raise RequestTimedOutError("bridge mode: this node was started without a ZooKeeper hook "
                                       "(start it with pidctl node start or python -m quorum)")
        loop = asyncio.get_running_loop()
        try:
            start, version = await loop.run_in_executor(None, zk.reserve, hosts, cursor, need, broker_id)
        except Exception as e:  # noqa: BLE001 - ZooKeeper unreachable, a malformed znode ...: retriable
            zk.reset()
            raise RequestTimedOutError(f"bridge mode: reserving {need} IDs in ZooKeeper ({hosts}) failed: "
                                       f"{type(e).__name__}: {e}") from None
        self.zk_reservations += 1
        return BridgeReservationRecord(reserved_start=start, reserved_end=start + need - 1, broker_id=broker_id,
                                       zk_version=version, timestamp_ms=ctx.now_ms)


__all__ = ["ApplyOutcome", "Proposal", "Proposer", "Service", "ZooKeeperHook"]
