"""What a Kafka API handler reaches the broker through: the part of ``broker.frontend.BrokerServer`` that
``broker.handlers`` and ``broker.api_table`` use, so that neither imports the front end."""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Protocol

from quorum.telemetry.logs import Throttled
from records.wire import kafka
from records.wire.errors import Errors

from ..acl_cache import AclCache
from ..config import BrokerConfig
from ..groups.coordinator import GroupCoordinator
from ..pid_binding import ProducerBindings
from ..pid_manager import ProducerIdManager
from ..quota import ProducerIdQuotaManager
from ..storage import Storage
from ..txn_coordinator import TxnCoordinator


class AppendWaiting(Protocol):
    """Long-polling Fetches waiting for an append (``broker.network.AppendWaiters``)."""

    def watch(self, keys: frozenset[tuple[str, int]]) -> asyncio.Future: ...

    def forget(self, fut: asyncio.Future, keys: frozenset[tuple[str, int]]) -> None: ...

    def appended(self, key: tuple[str, int]) -> int: ...


class BrokerContext(Protocol):
    """The broker's state and checks as its handlers see them."""

    cfg: BrokerConfig
    storage: Storage
    counters: dict[str, int]
    pids: ProducerIdManager | None
    txn: TxnCoordinator | None
    groups: GroupCoordinator | None  # consumer groups (created with the transaction coordinator)
    bindings: ProducerBindings | None  # SASL on: who each producer ID was handed to
    acls: AclCache | None  # SASL on
    quotas: ProducerIdQuotaManager
    api_table: dict[int, tuple[int, int]]  # the ApiVersions answer: this listener's APIs and versions
    _io: concurrent.futures.Executor  # appends and reads, off the event loop
    _waiters: AppendWaiting
    _produce_requests: int
    _binding_log: Throttled

    def _note_error(self, code: Errors) -> None: ...

    def _topic_allowed(self, req: kafka.Request, topic: str) -> bool: ...

    def _topic_acl(self, req: kafka.Request) -> str | None: ...

    def _error_body(self, api_key: int, version: int, code: Errors, body: Any = None) -> Any: ...
