"""Broker registrations (Kafka's BrokerRegistration and BrokerHeartbeat): epochs, fencing, sessions."""
from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass

from records import (
    BrokerEpochCursorRecord,
    FenceBrokerRecord,
    Record,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from records.wire.errors import (
    DuplicateBrokerRegistrationError,
    InvalidRequestError,
    InvariantViolation,
    StaleBrokerEpochError,
)

from .base import DEFAULT_BROKER_SESSION_TIMEOUT_MS, Result, _check_broker_id


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def duplicate_registration_message(broker_id: int, incarnation_id: str, expires_ms: int, now_ms: int) -> str:
    """The refusal of a new incarnation while ``incarnation_id`` holds ``broker_id`` (one line)."""
    return (f"broker {broker_id} is registered by live incarnation {incarnation_id}: its session expires at "
            f"{_utc(expires_ms)} (in {max(0, expires_ms - now_ms)} ms) unless it heartbeats again; a new "
            "incarnation can register once it has lapsed")


@dataclass
class Registration:
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    listener: str
    fenced: bool = False
    # The time of the broker's last logged heartbeat (an UnfenceBrokerRecord's timestamp_ms: the leader's
    # clock when it generated the record, the same on every node and on replay); None: it never heartbeated.
    heartbeat_ms: int | None = None

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                                    broker_epoch=self.broker_epoch, listener=self.listener)

    def session_expires_ms(self, session_timeout_ms: int) -> int | None:
        """When this registration's session lapses; None: it has none (never heartbeated, or fenced).

        Only what the log holds is read, so every node (a new leader, a node replaying the log or a
        snapshot) sees the same session: there is no leader-only state to lose in a failover."""
        if self.fenced or self.heartbeat_ms is None:
            return None
        return self.heartbeat_ms + session_timeout_ms


class BrokerRegistrationManager:
    """Registrations, with Kafka's rule for a broker id held by a live session (``generate_register``).

    A broker's session is its heartbeats: a heartbeat of an unfenced registration that moves the
    session on is logged (``UnfenceBrokerRecord``, whose ``timestamp_ms`` replay keeps as the session
    time), so the liveness every decision reads is replicated state, decided with the batch's clock
    (``now_ms``, the time the accepted records carry) and never the clock at apply time.
    """

    def __init__(self) -> None:
        self.brokers: dict[int, Registration] = {}
        self.last_epoch = 0  # highest epoch ever assigned; epochs start at 1

    # -- generate ----------------------------------------------------------
    def generate_register(self, broker_id: int, incarnation_id: str, listener: str, now_ms: int,
                          session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS) -> Result:
        """Register ``broker_id``: a new epoch, or the same one for the same incarnation (a retry).

        A different incarnation while the current registration's session is live (a heartbeat within
        ``session_timeout_ms`` of ``now_ms``) is refused with DUPLICATE_BROKER_REGISTRATION, as in
        Kafka's ClusterControlManager: a running broker is not fenced by a second process (or a
        principal with CLUSTER_ACTION) claiming its id.  A restarted broker registers once the old
        process's session has lapsed (its registration loop retries the refusal)."""
        _check_broker_id(broker_id)
        if not incarnation_id:
            raise InvalidRequestError("incarnation id is required")
        current = self.brokers.get(broker_id)
        if current is not None and current.incarnation_id == incarnation_id and not current.fenced:
            # The same process registering again (a retry): same epoch, nothing to commit.
            return Result([], current.broker_epoch)
        if current is not None and current.incarnation_id != incarnation_id:
            expires = current.session_expires_ms(session_timeout_ms)
            if expires is not None and now_ms <= expires:
                raise DuplicateBrokerRegistrationError(
                    duplicate_registration_message(broker_id, current.incarnation_id, expires, now_ms))
        epoch = self.last_epoch + 1
        rec = RegisterBrokerRecord(broker_id=broker_id, incarnation_id=incarnation_id, broker_epoch=epoch,
                                   listener=listener, timestamp_ms=now_ms)
        return Result([rec], epoch)

    def check_epoch(self, broker_id: int, broker_epoch: int) -> Registration:
        """The registration if ``broker_epoch`` is the broker's current one, else STALE_BROKER_EPOCH."""
        current = self.brokers.get(broker_id)
        if current is None:
            raise StaleBrokerEpochError(f"broker {broker_id} is not registered")
        if current.broker_epoch != broker_epoch:
            raise StaleBrokerEpochError(
                f"broker {broker_id} epoch {broker_epoch} does not match the registered epoch {current.broker_epoch}")
        return current

    def generate_heartbeat(self, broker_id: int, broker_epoch: int, want_fence: bool, want_shut_down: bool,
                           now_ms: int) -> Result:
        """Response: dict(is_fenced, should_shut_down)."""
        _check_broker_id(broker_id)
        reg = self.check_epoch(broker_id, broker_epoch)
        if want_shut_down:
            rec = UnregisterBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch, timestamp_ms=now_ms)
            return Result([rec], {"is_fenced": True, "should_shut_down": True})
        if want_fence and not reg.fenced:
            rec = FenceBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch, timestamp_ms=now_ms)
            return Result([rec], {"is_fenced": True, "should_shut_down": False})
        if not want_fence and (reg.fenced or reg.heartbeat_ms is None or now_ms > reg.heartbeat_ms):
            # Unfences a fenced broker; for an unfenced one, renews its session (logged, so that every node
            # and every later leader sees the same session: see generate_register).
            rec = UnfenceBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch, timestamp_ms=now_ms)
            return Result([rec], {"is_fenced": False, "should_shut_down": False})
        return Result([], {"is_fenced": reg.fenced, "should_shut_down": False})

    # -- replay --------------------------------------------------------------
    def replay(self, rec: Record) -> None:
        if isinstance(rec, RegisterBrokerRecord):
            if rec.broker_epoch <= self.last_epoch:
                raise InvariantViolation(
                    f"broker epoch {rec.broker_epoch} is not above the last assigned epoch {self.last_epoch}")
            self.brokers[rec.broker_id] = Registration(rec.broker_id, rec.incarnation_id, rec.broker_epoch,
                                                       rec.listener)
            self.last_epoch = rec.broker_epoch
        elif isinstance(rec, (FenceBrokerRecord, UnfenceBrokerRecord, UnregisterBrokerRecord)):
            reg = self.brokers.get(rec.broker_id)
            if reg is None or reg.broker_epoch != rec.broker_epoch:
                raise InvariantViolation(f"broker {rec.broker_id} epoch {rec.broker_epoch} is not registered")
            if isinstance(rec, UnregisterBrokerRecord):
                del self.brokers[rec.broker_id]
            elif isinstance(rec, FenceBrokerRecord):  # a new object, never changed in place: forks share them
                self.brokers[rec.broker_id] = dataclasses.replace(reg, fenced=True)
            else:
                # A heartbeat: the session runs from the record's time (the leader's clock in the log), never
                # backwards (a later leader's clock may be behind).  -1: a record without a time.
                heartbeat = reg.heartbeat_ms
                if rec.timestamp_ms >= 0 and (heartbeat is None or rec.timestamp_ms > heartbeat):
                    heartbeat = rec.timestamp_ms
                self.brokers[rec.broker_id] = dataclasses.replace(reg, fenced=False, heartbeat_ms=heartbeat)
        elif isinstance(rec, BrokerEpochCursorRecord):
            if rec.last_broker_epoch < self.last_epoch:
                raise InvariantViolation("broker epoch cursor would move backwards")
            self.last_epoch = rec.last_broker_epoch
        else:  # pragma: no cover - dispatch bug
            raise TypeError(f"not a registration record: {rec!r}")

    def fork(self) -> "BrokerRegistrationManager":
        """A scratch copy: a new dict over the same Registration objects (replay replaces, never mutates, them)."""
        other = BrokerRegistrationManager.__new__(BrokerRegistrationManager)
        other.brokers = dict(self.brokers)
        other.last_epoch = self.last_epoch
        return other

    def snapshot_records(self) -> list[Record]:
        # Registrations in epoch order replay cleanly; the cursor goes last, since
        # a registration's epoch must be above the cursor when it is replayed.
        out: list[Record] = []
        for reg in sorted(self.brokers.values(), key=lambda r: r.broker_epoch):
            out.append(reg.to_record())
            if reg.heartbeat_ms is not None:  # the session, then the fence over it
                out.append(UnfenceBrokerRecord(broker_id=reg.broker_id, broker_epoch=reg.broker_epoch,
                                               timestamp_ms=reg.heartbeat_ms))
            if reg.fenced:
                out.append(FenceBrokerRecord(broker_id=reg.broker_id, broker_epoch=reg.broker_epoch))
        out.append(BrokerEpochCursorRecord(last_broker_epoch=self.last_epoch))
        return out
