"""Replicated state, one slice per manager, in the style of Kafka's controller.

Each manager has two verbs: ``generate_*(request)`` reads state and returns ``Result(records,
response)``, changing nothing; ``replay(record)`` is the only mutation, deterministic (no clock,
randomness or I/O), and refuses a record that would break an invariant (``InvariantViolation``), which
then changes nothing.  ``QuorumState`` (``state.py``) holds the managers, dispatches records to them
and forks a scratch copy for the proposer to generate a batch against.
"""
from __future__ import annotations

from records.wire.errors import DuplicateBrokerRegistrationError, InvariantViolation  # noqa: F401 - what replay raises

from .base import (  # noqa: F401
    Context,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_BROKER_SESSION_TIMEOUT_MS,
    DEFAULT_MAX_TXN_TIMEOUT_MS,
    DEFAULT_TXN_EXPIRATION_MS,
    INT32_MAX,
    Result,
    TxnSettings,
)
from .registrations import (  # noqa: F401
    BrokerRegistrationManager,
    Registration,
    duplicate_registration_message,
)
from .cursor import (  # noqa: F401
    ProducerIdsManager,
    seed_overlap,
)
from .transactions import (  # noqa: F401
    ABORT,
    ADD,
    COMMIT,
    COMPLETE,
    COMPLETE_ABORT,
    COMPLETE_COMMIT,
    DESCRIBE,
    EMPTY,
    EPOCH_EXHAUSTED,
    EXPIRE_PER_BATCH,
    LIST,
    LIST_PAGE_CHARS,
    LIST_ROW_CHARS,
    MAX_REQUEST_ID_CHARS,
    MAX_TOPIC_CHARS,
    MAX_TRANSACTIONAL_ID_CHARS,
    MAX_TXN_PARTITIONS,
    NO_EPOCH,
    NO_PRODUCER_ID,
    ONGOING,
    PENDING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    TIMEOUT,
    TransactionalIdManager,
    VERIFY,
    txn_json,
)
from .migration import (  # noqa: F401
    BRIDGE,
    FINALIZED,
    MigrationManager,
    ROLLED_BACK,
)
from .acls import (  # noqa: F401
    AclManager,
)
from .state import (  # noqa: F401
    ApplyOutcome,
    QuorumState,
)

__all__ = ["ABORT", "ADD", "AclManager", "ApplyOutcome", "BRIDGE", "BrokerRegistrationManager", "COMMIT", "COMPLETE", "COMPLETE_ABORT", "COMPLETE_COMMIT", "Context", "DEFAULT_BLOCK_SIZE", "DEFAULT_BROKER_SESSION_TIMEOUT_MS", "DEFAULT_MAX_TXN_TIMEOUT_MS", "DEFAULT_TXN_EXPIRATION_MS", "DESCRIBE", "EMPTY", "EPOCH_EXHAUSTED", "EXPIRE_PER_BATCH", "FINALIZED", "INT32_MAX", "LIST", "LIST_PAGE_CHARS", "LIST_ROW_CHARS", "MAX_REQUEST_ID_CHARS", "MAX_TOPIC_CHARS", "MAX_TRANSACTIONAL_ID_CHARS", "MAX_TXN_PARTITIONS", "MigrationManager", "NO_EPOCH", "NO_PRODUCER_ID", "ONGOING", "PENDING", "PREPARE_ABORT", "PREPARE_COMMIT", "ProducerIdsManager", "QuorumState", "ROLLED_BACK", "Registration", "Result", "TIMEOUT", "TransactionalIdManager", "TxnSettings", "VERIFY", "duplicate_registration_message", "seed_overlap", "txn_json"]
