"""One error enum with Kafka's numbers, one exception class per code, one root type.

Unknown codes map to UNKNOWN_SERVER_ERROR.  ``RETRIABLE`` is the set a client
may retry (against this node or another).
"""
from __future__ import annotations

import enum


class Errors(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    TRANSACTIONAL_ID_NOT_FOUND = 105

    @classmethod
    def of(cls, code: int) -> "Errors":
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


RETRIABLE = frozenset({Errors.REQUEST_TIMED_OUT, Errors.NOT_CONTROLLER, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                       Errors.THROTTLING_QUOTA_EXCEEDED, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
                       Errors.CONCURRENT_TRANSACTIONS, Errors.NOT_LEADER_OR_FOLLOWER,
                       Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.CORRUPT_MESSAGE, Errors.UNSTABLE_OFFSET_COMMIT,
                       Errors.REBALANCE_IN_PROGRESS})


class PidQuorumError(Exception):
    """Root of every error pidquorum raises on purpose."""

    code: Errors = Errors.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", throttle_ms: int = 0):
        super().__init__(message or self.code.name)
        self.message = message or self.code.name
        self.throttle_ms = throttle_ms

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE


_BY_CODE: dict[Errors, type[PidQuorumError]] = {}


def _register(code: Errors) -> type[PidQuorumError]:
    name = "".join(part.capitalize() for part in code.name.split("_")) + "Error"
    cls = type(name, (PidQuorumError,), {"code": code, "__doc__": f"Kafka error {code.name} ({int(code)})."})
    _BY_CODE[code] = cls
    return cls


for _code in Errors:
    if _code != Errors.NONE:
        _register(_code)

UnknownServerError = _BY_CODE[Errors.UNKNOWN_SERVER_ERROR]
CorruptMessageError = _BY_CODE[Errors.CORRUPT_MESSAGE]
RequestTimedOutError = _BY_CODE[Errors.REQUEST_TIMED_OUT]
CoordinatorLoadInProgressError = _BY_CODE[Errors.COORDINATOR_LOAD_IN_PROGRESS]
UnsupportedVersionError = _BY_CODE[Errors.UNSUPPORTED_VERSION]
ClusterAuthorizationFailedError = _BY_CODE[Errors.CLUSTER_AUTHORIZATION_FAILED]
NotControllerError = _BY_CODE[Errors.NOT_CONTROLLER]
InvalidRequestError = _BY_CODE[Errors.INVALID_REQUEST]
StaleBrokerEpochError = _BY_CODE[Errors.STALE_BROKER_EPOCH]
ThrottlingQuotaExceededError = _BY_CODE[Errors.THROTTLING_QUOTA_EXCEEDED]
BrokerIdNotRegisteredError = _BY_CODE[Errors.BROKER_ID_NOT_REGISTERED]
# The broker id is held by a live registration of another incarnation (quorum.managers): not retriable, so
# ``pidctl broker register`` shows the refusal; a broker's own registration loop retries it until the old
# session lapses (broker.pid_manager).
DuplicateBrokerRegistrationError = _BY_CODE[Errors.DUPLICATE_BROKER_REGISTRATION]
OutOfOrderSequenceNumberError = _BY_CODE[Errors.OUT_OF_ORDER_SEQUENCE_NUMBER]
InvalidProducerEpochError = _BY_CODE[Errors.INVALID_PRODUCER_EPOCH]
ProducerFencedError = _BY_CODE[Errors.PRODUCER_FENCED]
InvalidProducerIdMappingError = _BY_CODE[Errors.INVALID_PRODUCER_ID_MAPPING]
ConcurrentTransactionsError = _BY_CODE[Errors.CONCURRENT_TRANSACTIONS]
InvalidTxnStateError = _BY_CODE[Errors.INVALID_TXN_STATE]
InvalidTransactionTimeoutError = _BY_CODE[Errors.INVALID_TRANSACTION_TIMEOUT]
UnknownProducerIdError = _BY_CODE[Errors.UNKNOWN_PRODUCER_ID]
TransactionalIdAuthorizationFailedError = _BY_CODE[Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
SaslAuthenticationFailedError = _BY_CODE[Errors.SASL_AUTHENTICATION_FAILED]
UnsupportedSaslMechanismError = _BY_CODE[Errors.UNSUPPORTED_SASL_MECHANISM]
UnknownTopicOrPartitionError = _BY_CODE[Errors.UNKNOWN_TOPIC_OR_PARTITION]
InvalidTopicError = _BY_CODE[Errors.INVALID_TOPIC_EXCEPTION]
OffsetOutOfRangeError = _BY_CODE[Errors.OFFSET_OUT_OF_RANGE]


def for_code(code: int, message: str = "", throttle_ms: int = 0) -> PidQuorumError:
    return _BY_CODE[Errors.of(code)](message, throttle_ms)


class InvariantViolation(Exception):
    """Replay refused a record: applying it would break a state invariant.

    Raised only by ``replay``; the record changes nothing, on every node alike.
    """
