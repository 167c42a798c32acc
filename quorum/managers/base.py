"""What every slice of the replicated state shares: a generate step's ``Result`` and ``Context``, and the limits."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from records import Record
from records.schema import INT_RANGES
from records.wire.errors import InvalidRequestError


DEFAULT_BLOCK_SIZE = 1000
INT32_MAX = INT_RANGES["int32"][1]


@dataclass
class Result:
    records: list[Record]
    response: Any


# Kafka's broker.session.timeout.ms: a registration whose broker heartbeated within this long is live, and
# a new incarnation of its broker id is refused (DUPLICATE_BROKER_REGISTRATION) until the session lapses.
DEFAULT_BROKER_SESSION_TIMEOUT_MS = 9000

DEFAULT_TXN_EXPIRATION_MS = 7 * 24 * 3600 * 1000   # transactional.id.expiration.ms
DEFAULT_MAX_TXN_TIMEOUT_MS = 15 * 60 * 1000        # transaction.max.timeout.ms


@dataclass(frozen=True)
class TxnSettings:
    expiration_ms: int = DEFAULT_TXN_EXPIRATION_MS
    max_timeout_ms: int = DEFAULT_MAX_TXN_TIMEOUT_MS


@dataclass(frozen=True)
class Context:
    """What a generate step may read besides the state and the request: the node's settings and the
    batch's clock (one timestamp for every record of a batch)."""
    block_size: int
    now_ms: int
    txn: TxnSettings
    # Kafka's broker.session.timeout.ms: how long after its last heartbeat a registration holds its broker
    # id against a new incarnation (BrokerRegistration answers DUPLICATE_BROKER_REGISTRATION meanwhile).
    session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS


def _check_broker_id(broker_id: int) -> None:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int) or not 0 <= broker_id <= INT32_MAX:
        raise InvalidRequestError(f"broker id {broker_id!r} is not in 0..{INT32_MAX}")

