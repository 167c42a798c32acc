"""Chaos workloads: clients whose every operation goes into the history.

Two kinds of client run at once, each a set of Jepsen-style *processes* (one
outstanding operation per process):

* ``broker-N``: a broker allocating blocks directly through the wire protocol
  (AllocateProducerIds), one call at a time, at a target rate.
* ``pidmgr-N/...``: a real ``ProducerIdManager`` (the broker side) fed by the
  quorum.  Its refill task's calls are recorded as process ``pidmgr-N/alloc``;
  simulated clients ``pidmgr-N/client-K`` call ``generate_producer_id()`` at a
  target rate, and each call is one operation (invoke and completion at the
  same instant: the call never blocks).

Outcomes follow Jepsen: ``ok`` and ``fail`` are definite; anything whose
effect is unknown (a timeout, a dropped connection, a retry that gave up) is
``info`` and is never counted as a success.  The checker groups processes by
the owner before the "/" (a PID must come from its own manager's blocks).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from broker.pid_manager import PidManagerConfig, ProducerIdManager
from quorum.client.quorum import AllocatedBlock, ConnectionFailed, QuorumClient, RetryPolicy
from records.wire.errors import Errors, PidQuorumError

from .history import HistoryWriter, Op, now_ns

log = logging.getLogger(__name__)

# Errors that say the request was certainly not applied.  Everything else
# (timeouts above all) leaves the outcome unknown.
DEFINITE = frozenset({Errors.STALE_BROKER_EPOCH, Errors.BROKER_ID_NOT_REGISTERED, Errors.THROTTLING_QUOTA_EXCEEDED,
                      Errors.INVALID_REQUEST, Errors.CLUSTER_AUTHORIZATION_FAILED, Errors.COORDINATOR_LOAD_IN_PROGRESS})


def classify(err: BaseException) -> tuple[str, str]:
    """(history type, error name) for an exception from a quorum call."""
    if isinstance(err, PidQuorumError):
        return ("fail" if err.code in DEFINITE else "info"), err.code.name
    if isinstance(err, ConnectionFailed):
        return "info", "CONNECTION_FAILED"
    if isinstance(err, asyncio.TimeoutError):
        return "info", "REQUEST_TIMED_OUT"
    return "info", type(err).__name__


def _policy() -> RetryPolicy:
    # Short deadlines: a call that cannot finish quickly is recorded as info and retried
    # with a fresh request, so faults show up in the history instead of being hidden.
    return RetryPolicy(timeout=3.0, attempt_timeout=0.6, backoff_initial=0.02, backoff_max=0.2)


class _Pacer:
    """Calls at ``rate`` per second on average, catching up after a stall without bursting past 1 s."""

    def __init__(self, rate: float):
        self.period = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    async def wait(self) -> None:
        if self.period <= 0:
            await asyncio.sleep(0)
            return
        self.next = max(self.next + self.period, time.monotonic() - 1.0)
        delay = self.next - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class WorkloadConfig:
    brokers: int = 2                 # wire-protocol allocators
    block_rate: float = 20.0         # AllocateProducerIds/s per broker process
    pid_managers: int = 2
    clients_per_manager: int = 4
    pid_rate: float = 1000.0         # generate_producer_id() calls/s per manager (all its clients)


class BrokerAllocator:
    """``broker-N``: register, then allocate blocks one at a time, recording each call."""

    def __init__(self, broker_id: int, addresses: list[str], history: HistoryWriter, rate: float):
        self.broker_id = broker_id
        self.process = f"broker-{broker_id}"
        self.client = QuorumClient(list(addresses), _policy(), client_id=self.process)
        self.history = history
        self.rate = rate
        self.epoch: int | None = None

    async def _register(self) -> None:
        while self.epoch is None:
            self.history.append(Op(self.process, "invoke", "register", {"broker_id": self.broker_id}, now_ns()))
            try:
                self.epoch = await self.client.register_broker(self.broker_id)
                self.history.append(Op(self.process, "ok", "register",
                                       {"broker_id": self.broker_id, "broker_epoch": self.epoch}, now_ns()))
            except (PidQuorumError, ConnectionFailed, asyncio.TimeoutError) as e:
                kind, name = classify(e)
                self.history.append(Op(self.process, kind, "register", {"broker_id": self.broker_id}, now_ns(),
                                       error=name))
                await asyncio.sleep(0.1)

    async def run(self, stop: asyncio.Event) -> None:
        pacer = _Pacer(self.rate)
        try:
            await self._register()
            while not stop.is_set():
                await pacer.wait()
                if stop.is_set():
                    break
                value = {"broker_id": self.broker_id, "broker_epoch": self.epoch}
                self.history.append(Op(self.process, "invoke", "allocate", value, now_ns()))
                try:
                    b: AllocatedBlock = await self.client.allocate(self.broker_id, self.epoch)
                    self.history.append(Op(self.process, "ok", "allocate",
                                           {**value, "start": b.start, "length": b.length}, now_ns()))
                except (PidQuorumError, ConnectionFailed, asyncio.TimeoutError) as e:
                    kind, name = classify(e)
                    self.history.append(Op(self.process, kind, "allocate", value, now_ns(), error=name))
                    if isinstance(e, PidQuorumError) and e.code in (Errors.STALE_BROKER_EPOCH,
                                                                    Errors.BROKER_ID_NOT_REGISTERED):
                        self.epoch = None
                        await self._register()
        finally:
            await self.client.close()


class _RecordingQuorum:
    """What a ProducerIdManager calls, with every allocation recorded under ``<owner>/alloc``."""

    def __init__(self, client: QuorumClient, history: HistoryWriter, owner: str):
        self.client = client
        self.history = history
        self.process = f"{owner}/alloc"

    async def register_broker(self, broker_id: int, incarnation_id=None, listener: str = "") -> int:
        value = {"broker_id": broker_id}
        self.history.append(Op(self.process, "invoke", "register", value, now_ns()))
        try:
            epoch = await self.client.register_broker(broker_id, incarnation_id, listener)
        except BaseException as e:
            kind, name = classify(e) if isinstance(e, Exception) else ("info", "CANCELLED")
            self.history.append(Op(self.process, kind, "register", value, now_ns(), error=name))
            raise
        self.history.append(Op(self.process, "ok", "register", {**value, "broker_epoch": epoch}, now_ns()))
        return epoch

    async def allocate(self, broker_id: int, broker_epoch: int) -> AllocatedBlock:
        value = {"broker_id": broker_id, "broker_epoch": broker_epoch}
        self.history.append(Op(self.process, "invoke", "allocate", value, now_ns()))
        try:
            b = await self.client.allocate(broker_id, broker_epoch)
        except BaseException as e:
            kind, name = classify(e) if isinstance(e, Exception) else ("info", "CANCELLED")
            self.history.append(Op(self.process, kind, "allocate", value, now_ns(), error=name))
            raise
        self.history.append(Op(self.process, "ok", "allocate", {**value, "start": b.start, "length": b.length},
                               now_ns()))
        return b


class PidManagerWorkload:
    """``pidmgr-N``: a real ProducerIdManager and simulated clients asking it for PIDs."""

    def __init__(self, broker_id: int, addresses: list[str], history: HistoryWriter, rate: float, clients: int,
                 config: PidManagerConfig | None = None):
        self.owner = f"pidmgr-{broker_id}"
        self.client = QuorumClient(list(addresses), _policy(), client_id=self.owner)
        self.history = history
        self.manager = ProducerIdManager(broker_id, _RecordingQuorum(self.client, history, self.owner),
                                         config=config or PidManagerConfig(start_timeout_s=60))
        self.rate = rate
        self.clients = clients

    async def _client(self, k: int, stop: asyncio.Event) -> None:
        process = f"{self.owner}/client-{k}"
        pacer = _Pacer(self.rate / self.clients)
        append = self.history.append
        while not stop.is_set():
            await pacer.wait()
            t = now_ns()
            append(Op(process, "invoke", "generate", None, t))
            try:
                pid = self.manager.generate_producer_id()
            except PidQuorumError as e:
                append(Op(process, "fail", "generate", None, now_ns(), error=e.code.name))
                continue
            append(Op(process, "ok", "generate", pid, now_ns()))

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.manager.start()
            await asyncio.gather(*(self._client(k, stop) for k in range(self.clients)))
        finally:
            await self.manager.close()
            await self.client.close()

    def stats(self) -> dict[str, Any]:
        return self.manager.stats()
