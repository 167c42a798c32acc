"""A fake quorum, clock and sleep for broker.pid_manager's tests (test_pid_manager*, and the broker's
metrics and front-end tests): the quorum answers from a script of blocks, errors and hangs."""
from __future__ import annotations

import asyncio
import collections
import time

from broker.pid_manager import PidManagerConfig, ProducerIdManager
from quorum.client.quorum import AllocatedBlock
from records.wire.errors import CoordinatorLoadInProgressError, Errors, StaleBrokerEpochError, for_code


HANG = "hang"
TopicAuthorizationFailedError = type(for_code(Errors.TOPIC_AUTHORIZATION_FAILED))


class FakeQuorum:
    """Consecutive blocks of ``block_size`` from ``first``; ``script`` overrides calls one by one."""

    def __init__(self, block_size: int = 10, first: int = 0, clock=None, allocate_delay_s: float = 0.0):
        self.block_size = block_size
        self.next = first
        self.script: collections.deque = collections.deque()
        self.hang_forever = False
        self.last_epoch = 0
        self.epochs: dict[int, int] = {}
        self.register_calls: list[tuple[int, object, str]] = []
        self.allocate_calls: list[tuple[int, int]] = []
        self.returned: list[tuple[int, int]] = []
        self.in_flight = 0
        self.cancelled = 0
        self.clock = clock
        self.allocate_delay_s = allocate_delay_s  # advances a FakeClock: an outage the client hid

    async def register_broker(self, broker_id, incarnation_id=None, listener=""):
        self.register_calls.append((broker_id, incarnation_id, listener))
        self.last_epoch += 1
        self.epochs[broker_id] = self.last_epoch
        return self.last_epoch

    async def allocate(self, broker_id, broker_epoch):
        self.allocate_calls.append((broker_id, broker_epoch))
        self.in_flight += 1
        try:
            action = self.script.popleft() if self.script else (HANG if self.hang_forever else None)
            if action == HANG:
                await asyncio.Event().wait()
            if isinstance(action, BaseException):
                raise action
            if self.epochs.get(broker_id) != broker_epoch:
                raise StaleBrokerEpochError(f"broker {broker_id} epoch {broker_epoch}")
            if self.clock is not None and self.allocate_delay_s:
                self.clock.t += self.allocate_delay_s
            if isinstance(action, tuple):
                start, length = action
            else:
                start, length = self.next, self.block_size
                self.next += length
            self.returned.append((start, length))
            return AllocatedBlock(start, length, 0, "fake")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class SleepRecorder:
    """An injected ``sleep``: records each delay and returns at once."""

    def __init__(self):
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


async def settle(rounds: int = 50) -> None:
    """Let the refill task run whatever it can run without time passing."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def take(mgr: ProducerIdManager, n: int, timeout: float = 5.0) -> list[int]:
    """n IDs, retrying load-in-progress like a client does (with a deadline)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        try:
            out.append(mgr.generate_producer_id())
        except CoordinatorLoadInProgressError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.0005)
    return out


def fixed(**kw) -> PidManagerConfig:
    """Kafka-like: one block in reserve, fetched at 90 % use; tests override what they need."""
    return PidManagerConfig.kafka_fixed_threshold(**kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))
