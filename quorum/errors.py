"""One error enum with Kafka's numbers, one exception class per code, one root type.

Unknown codes map to UNKNOWN_SERVER_ERROR.  ``RETRIABLE`` is the set a client
may retry (against this node or another).
"""
from __future__ import annotations

import enum


class Errors(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    CORRUPT_MESSAGE = 2
    REQUEST_TIMED_OUT = 7
    COORDINATOR_LOAD_IN_PROGRESS = 14
    UNSUPPORTED_VERSION = 35
    CLUSTER_AUTHORIZATION_FAILED = 31
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    STALE_BROKER_EPOCH = 77
    THROTTLING_QUOTA_EXCEEDED = 89
    BROKER_ID_NOT_REGISTERED = 102

    @classmethod
    def of(cls, code: int) -> "Errors":
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


RETRIABLE = frozenset({Errors.REQUEST_TIMED_OUT, Errors.NOT_CONTROLLER, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                       Errors.THROTTLING_QUOTA_EXCEEDED})


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


UnknownServerError = _register(Errors.UNKNOWN_SERVER_ERROR)
CorruptMessageError = _register(Errors.CORRUPT_MESSAGE)
RequestTimedOutError = _register(Errors.REQUEST_TIMED_OUT)
CoordinatorLoadInProgressError = _register(Errors.COORDINATOR_LOAD_IN_PROGRESS)
UnsupportedVersionError = _register(Errors.UNSUPPORTED_VERSION)
ClusterAuthorizationFailedError = _register(Errors.CLUSTER_AUTHORIZATION_FAILED)
NotControllerError = _register(Errors.NOT_CONTROLLER)
InvalidRequestError = _register(Errors.INVALID_REQUEST)
StaleBrokerEpochError = _register(Errors.STALE_BROKER_EPOCH)
ThrottlingQuotaExceededError = _register(Errors.THROTTLING_QUOTA_EXCEEDED)
BrokerIdNotRegisteredError = _register(Errors.BROKER_ID_NOT_REGISTERED)


def for_code(code: int, message: str = "", throttle_ms: int = 0) -> PidQuorumError:
    return _BY_CODE[Errors.of(code)](message, throttle_ms)


class InvariantViolation(Exception):
    """Replay refused a record: applying it would break a state invariant.

    Raised only by ``replay``; the record changes nothing, on every node alike.
    """


class CorruptFileError(Exception):
    """A journal, meta, snapshot or audit file failed its checks; the node refuses to start."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem
