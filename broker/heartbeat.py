"""The broker's heartbeat task (Kafka's BrokerLifecycleManager): BrokerHeartbeat for the registered epoch every
interval, so that the registration has a live session in the quorum (docs/brokers.md, "Producer-ID blocks,
registration and heartbeats")."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Protocol

from quorum.telemetry.logs import Throttled
from records.wire.errors import BrokerIdNotRegisteredError, StaleBrokerEpochError

# The producer-ID manager's logger: the manager runs this task, and log settings name the manager.
log = logging.getLogger("broker.pid_manager")


class Registration(Protocol):
    """The broker's registration as the heartbeat task sees it (``ProducerIdManager`` is one)."""

    broker_id: int
    broker_epoch: int | None  # None: not registered now
    quorum: Any  # with ``heartbeat(broker_id, broker_epoch)``

    @property
    def closed(self) -> bool: ...

    def heartbeat_refused_epoch(self) -> None:
        """A heartbeat found the epoch stale or gone: drop it and register again."""


class BrokerHeartbeat:
    """Sends BrokerHeartbeat for ``registration``'s epoch every ``interval_s`` (from the start of the last one),
    at once after a registration (``registered``); counts and logs what the quorum answers."""

    def __init__(self, registration: Registration, interval_s: float):
        self._reg = registration
        self.interval_s = interval_s
        self._kick: asyncio.Event | None = None  # set by a registration: heartbeat now
        self.answered = 0  # heartbeats answered without an error
        self.errors: collections.Counter[str] = collections.Counter()
        self.re_registrations = 0
        self.last_ok: float | None = None  # time.monotonic()
        self._failing_since: float | None = None
        self._log = Throttled(log, 10.0)

    def arm(self) -> None:
        """From now on a registration cuts the wait for the next beat short (called when the manager starts)."""
        self._kick = asyncio.Event()

    def registered(self) -> None:
        """A registration (a new epoch): its session starts now, heartbeat at once."""
        if self._kick is not None:
            self._kick.set()

    async def run(self) -> None:
        reg = self._reg
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        try:
            while not reg.closed:
                wait = next_at - loop.time()
                if reg.broker_epoch is None or wait > 0:
                    # Until the next beat is due; a registration (a new epoch) cuts the wait short.
                    try:
                        await asyncio.wait_for(self._kick.wait(), None if reg.broker_epoch is None else wait)
                    except asyncio.TimeoutError:
                        pass
                    if self._kick.is_set():
                        self._kick.clear()
                        next_at = loop.time()
                    continue
                next_at = loop.time() + self.interval_s
                await self.beat(reg.broker_epoch)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("broker %d: heartbeat task failed", reg.broker_id)
            raise

    async def beat(self, epoch: int) -> None:
        reg = self._reg
        try:
            answer = await reg.quorum.heartbeat(reg.broker_id, epoch)
        except asyncio.CancelledError:
            raise
        except (StaleBrokerEpochError, BrokerIdNotRegisteredError) as e:
            # The registration is gone or replaced: register again (the refill task's path, as after a
            # refused AllocateProducerIds: backed off, then registered); the new registration heartbeats at once.
            self.errors[type(e).__name__] += 1
            if reg.broker_epoch == epoch:
                self.re_registrations += 1
                log.warning("broker %d: heartbeat of epoch %s refused (%s); registering again", reg.broker_id,
                            epoch, e.code.name)
                reg.heartbeat_refused_epoch()
            return
        except Exception as e:  # noqa: BLE001 - the quorum unavailable, ...: next beat at the interval
            self.errors[type(e).__name__] += 1
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
            self._log(logging.WARNING, "broker %d: heartbeat (epoch %s) failed for %.1f s: %s: %s",
                      reg.broker_id, epoch, now - self._failing_since, type(e).__name__, e)
            return
        self.answered += 1
        self.last_ok = time.monotonic()
        if self._failing_since is not None:
            log.info("broker %d: heartbeats answered again after %.1f s", reg.broker_id,
                     self.last_ok - self._failing_since)
            self._failing_since = None
        if isinstance(answer, dict) and (answer.get("is_fenced") or answer.get("should_shut_down")):
            self._log(logging.WARNING, "broker %d: heartbeat (epoch %s) answered %s", reg.broker_id, epoch, answer)
