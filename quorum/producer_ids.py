"""The producer-ID controller: every rule of issuing producer IDs on the leader, in one place.

AllocateProducerIds reaches ``ProducerIdController.allocate`` from the RPC table.  In order: the
per-broker rate limit, a test's failpoint, the leader-side block reserve, else one block generated
from the applied state (``generate_allocate``) and proposed.  Bridge mode reserves the IDs a batch
issues in ZooKeeper before it is proposed (``bridge_reservation``); a rollback writes ZooKeeper's
placeholder once committed (``migrate``); nothing issues IDs once the migration is rolled back
(``check_issuing``).  The generate steps are plain functions of the state, so the simulator and the
unit tests run them without a server.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Protocol

from quorum import failpoints
from quorum.client import api
from records import AllocateProducerIdsRecord, BridgeReservationRecord, Record
from records.wire.errors import RequestTimedOutError, ThrottlingQuotaExceededError, UnknownServerError

from .managers import BRIDGE, ROLLED_BACK, Context, QuorumState, Result
from .reserve import Block, BlockReserve

BUCKET_PRUNE_AT = 1024  # throttle buckets kept before idle ones are pruned

Generate = Callable[[QuorumState, Context], Result]


# ------------------------------------------------------------ generate steps
def check_issuing(state: QuorumState) -> None:
    """Every RPC that issues producer IDs: refused once the migration is rolled back."""
    if state.migration.mode == ROLLED_BACK:
        raise UnknownServerError("producer IDs are allocated by ZooKeeper again (the migration was rolled "
                                 "back); run `pidctl migrate bridge` to come back")


def generate_allocate(state: QuorumState, body: Any, ctx: Context) -> Result:
    """One block for the asking broker, from the applied state: (start, length)."""
    check_issuing(state)
    return state.producer_ids.generate_allocate(int(body.broker_id), int(body.broker_epoch), state.registrations,
                                                ctx.block_size, ctx.now_ms)


def generate_seed(state: QuorumState, body: Any, ctx: Context) -> Result:
    check_issuing(state)
    return state.producer_ids.generate_seed(body.next_producer_id, body.origin, body.zk_broker,
                                            body.zk_block_start, body.zk_block_end, ctx.now_ms)


def generate_migrate(state: QuorumState, body: Any, ctx: Context) -> Result:
    return state.migration.generate_command(body.action, body.zk, state.producer_ids.next_producer_id, ctx.now_ms)


# ------------------------------------------------------------- rate limit
class TokenBucket:
    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> int:
        """0 if a token was taken, else the milliseconds until one is available."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0
        return max(1, int((1 - self.tokens) / self.rate * 1000 + 0.999))


class RateLimit:
    """AllocateProducerIds per broker (``allocate_rate_per_broker``, ``allocate_burst``; rate 0: off)."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.throttled = 0
        self.buckets: dict[int, TokenBucket] = {}
        self._limit = BUCKET_PRUNE_AT

    def check(self, broker_id: int) -> None:
        if self.rate <= 0:
            return
        bucket = self.buckets.get(broker_id)
        if bucket is None:
            if len(self.buckets) >= self._limit:
                self._prune()
            bucket = self.buckets[broker_id] = TokenBucket(self.rate, self.burst)
        wait_ms = bucket.take()
        if wait_ms:
            self.throttled += 1
            raise ThrottlingQuotaExceededError(
                f"broker {broker_id} is over {self.rate:g} AllocateProducerIds/s; retry in {wait_ms} ms", wait_ms)

    def _prune(self) -> None:
        """Forget buckets that have refilled to their burst (a new bucket is the same), so requests
        naming ever new broker ids (garbage) cannot grow the table without bound."""
        now = time.monotonic()
        self.buckets = {b: t for b, t in self.buckets.items() if t.tokens + (now - t.stamp) * t.rate < t.burst}
        self._limit = max(BUCKET_PRUNE_AT, 2 * len(self.buckets))


# ------------------------------------------------------------- the leader
class ZooKeeperHook(Protocol):
    """What bridge mode and rollback need of ZooKeeper (``quorum.migration.bridge.ZooKeeperBridge``); blocking."""

    def reserve(self, hosts: str, min_start: int, length: int, broker_id: int) -> tuple[int, int]: ...

    def reset(self) -> None: ...

    def write_placeholder(self, hosts: str, start: int, length: int) -> str: ...


class Proposing(Protocol):
    """What the controller needs of the proposer (``quorum.proposer.Proposer``)."""

    def enqueue(self, generate: Generate, broker_id: int | None,
                on_value: Callable[[Any], None] | None = None) -> asyncio.Future: ...

    async def wait(self, future: asyncio.Future, timeout: float) -> Any: ...


async def bridge_reservation(zookeeper: ZooKeeperHook | None, generate: Generate, broker_id: int | None,
                             scratch: QuorumState, ctx: Context) -> Record | None:
    """Bridge mode: reserve in the znode, *before* proposing, the IDs ``generate`` is about to take.

    Reserving after committing would let a ZooKeeper-mode broker take the same range in between.  A
    reservation whose entry then fails to commit only wastes the range (ZooKeeper has moved past it).
    Any ZooKeeper failure fails the request (retriable)."""
    if scratch.migration.mode != BRIDGE:
        return None
    trial = generate(scratch.fork(), ctx)
    need = sum(r.producer_id_len for r in trial.records if isinstance(r, AllocateProducerIdsRecord))
    if need == 0:
        return None
    broker_id = -1 if broker_id is None else broker_id
    hosts, cursor = scratch.migration.zk, scratch.producer_ids.next_producer_id
    if zookeeper is None:
        raise RequestTimedOutError("bridge mode: this node was started without a ZooKeeper hook "
                                   "(start it with pidctl node start or python -m quorum)")
    try:
        start, version = await asyncio.get_running_loop().run_in_executor(
            None, zookeeper.reserve, hosts, cursor, need, broker_id)
    except Exception as e:  # noqa: BLE001 - ZooKeeper unreachable, a malformed znode ...: retriable
        zookeeper.reset()
        raise RequestTimedOutError(f"bridge mode: reserving {need} IDs in ZooKeeper ({hosts}) failed: "
                                   f"{type(e).__name__}: {e}") from None
    return BridgeReservationRecord(reserved_start=start, reserved_end=start + need - 1, broker_id=broker_id,
                                   zk_version=version, timestamp_ms=ctx.now_ms)


class ProducerIdController:
    """Allocation on the leader.  ``service`` is the node's ``Service`` (its applied state under its lock,
    its clock, its Raft role, its config and ZooKeeper hook); ``proposer`` proposes generated records."""

    def __init__(self, service: Any, proposer: Proposing):
        self.service, self.proposer = service, proposer
        cfg = service.cfg
        self.rate_limit = RateLimit(cfg.allocate_rate_per_broker, cfg.allocate_burst)
        self.reserve = BlockReserve(cfg.allocate_reserve_blocks, lambda: service.raft.role(), self._registered,
                                    lambda: service.clock.monotonic(), self._propose_blocks)

    async def allocate(self, body: Any, timeout: float, on_value: Callable[[Any], None] | None = None) -> Block:
        """AllocateProducerIds: a block for the broker, from the reserve or committed now.  ``on_value``
        (see ``Proposer.enqueue``) answers from the tick that applies the entry; not with the reserve on,
        whose bookkeeping of the block handed out runs here first."""
        broker_id, epoch = int(body.broker_id), int(body.broker_epoch)
        self.rate_limit.check(broker_id)
        forced = failpoints.hit("quorum.allocate", self.service)  # a test's broken allocator
        if forced is not None:
            return forced
        generate = _bind(generate_allocate, body)
        if not self.reserve.size:
            return await self.proposer.wait(self.proposer.enqueue(generate, broker_id, on_value), timeout)
        block, active = await self.reserve.take(broker_id, epoch, timeout)
        if block is not None:
            return block
        block = await self.proposer.wait(self.proposer.enqueue(generate, broker_id), timeout)
        self.reserve.handed_out(broker_id, epoch, block, active)
        return block

    async def migrate(self, body: Any, timeout: float, on_value: Callable[[Any], None] | None = None) -> dict:
        """MigrationCommand: the mode change committed; a rollback then writes ZooKeeper's placeholder."""
        changed, mode = await self.proposer.wait(self.proposer.enqueue(_bind(generate_migrate, body), None), timeout)
        service = self.service
        with service.lock:
            next_id = service.state.producer_ids.next_producer_id
            zk = service.state.migration.zk
        message = f"migration mode {mode}" + ("" if changed else " (unchanged)")
        if body.action == "rollback":
            # Committed first (the quorum now issues nothing), so the cursor is final: the placeholder at it
            # puts ZooKeeper-mode allocation above every ID the quorum ever issued.
            message = await asyncio.get_running_loop().run_in_executor(
                None, self._write_rollback_placeholder, zk, next_id, service.cfg.block_size)
        return {"mode": mode, "changed": changed, "next_producer_id": next_id, "message": message}

    def _write_rollback_placeholder(self, zk_hosts: str, start: int, length: int) -> str:
        """Rollback: the placeholder block (broker -1) at the quorum's next ID; raises a retriable error if
        ZooKeeper cannot be written (the mode is already rolled back: run the rollback again)."""
        zookeeper = self.service.zookeeper
        if zookeeper is None:
            raise RequestTimedOutError("rolled back, but this node was started without a ZooKeeper hook to write "
                                       "the placeholder; run the rollback again on a node started with pidctl node "
                                       "start")
        try:
            return zookeeper.write_placeholder(zk_hosts, start, length)
        except Exception as e:  # noqa: BLE001 - report, the operator reruns the (idempotent) rollback
            raise RequestTimedOutError(f"rolled back, but writing the placeholder to ZooKeeper ({zk_hosts}) "
                                       f"failed: {type(e).__name__}: {e}; run the rollback again") from None

    def _registered(self, broker_id: int) -> tuple[int | None, str | None]:
        """(the broker's registered epoch or None, the migration mode), from the applied state."""
        with self.service.lock:
            reg = self.service.state.registrations.brokers.get(broker_id)
            return (reg.broker_epoch if reg is not None else None), self.service.state.migration.mode

    def _propose_blocks(self, broker_id: int, epoch: int, count: int) -> asyncio.Future:
        """The reserve's refill: several blocks for one broker, one after the other, in one entry."""
        request = api.allocate_request(broker_id, epoch)

        def generate(state: QuorumState, ctx: Context) -> Result:
            tmp, records, blocks = state.fork(), [], []
            for _ in range(count):
                r = generate_allocate(tmp, request, ctx)
                tmp.apply_batch(r.records)
                records += r.records
                blocks.append(r.response)
            return Result(records, blocks)
        return self.proposer.enqueue(generate, broker_id)


def _bind(generate: Callable[[QuorumState, Any, Context], Result], body: Any) -> Generate:
    return lambda state, ctx: generate(state, body, ctx)


__all__ = ["BUCKET_PRUNE_AT", "ProducerIdController", "RateLimit", "ZooKeeperHook", "bridge_reservation",
           "check_issuing", "generate_allocate", "generate_migrate", "generate_seed"]
