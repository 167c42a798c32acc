"""The ZooKeeper migration mode (bridge, finalized, rolled back) and, in bridge mode, the reserved range."""
from __future__ import annotations

from typing import Any

from records import (
    BridgeReservationRecord,
    MigrationCursorRecord,
    MigrationStateRecord,
    Record,
)
from records.wire.errors import (
    InvalidRequestError,
    InvariantViolation,
)

from .base import Result


BRIDGE, FINALIZED, ROLLED_BACK = "bridge", "finalized", "rolled-back"
_TRANSITIONS = {None: {BRIDGE}, BRIDGE: {FINALIZED, ROLLED_BACK}, FINALIZED: {ROLLED_BACK}, ROLLED_BACK: {BRIDGE}}


class MigrationManager:
    """The migration mode, and in bridge mode how far the znode has been reserved.

    In bridge mode every allocation must lie inside a range the leader reserved in
    ZooKeeper *before* proposing it (a BridgeReservationRecord earlier in the same or
    an earlier entry): replay refuses anything else, so no ZooKeeper-mode broker can
    take a range the quorum commits.  Rolled back: the quorum issues nothing.
    """

    def __init__(self) -> None:
        self.mode: str | None = None
        self.zk = ""
        self.reserved_until = 0  # exclusive end of the reserved ranges (bridge mode)

    def generate_command(self, action: str, zk: str, cursor: int, now_ms: int) -> Result:
        """Response: (changed, mode).  Rollback's placeholder is written by the caller, after commit."""
        target = {"bridge": BRIDGE, "finalize": FINALIZED, "rollback": ROLLED_BACK}.get(action)
        if target is None:
            raise InvalidRequestError(f"unknown migration action {action!r} (bridge, finalize, rollback)")
        zk = zk or self.zk
        if target == BRIDGE and not zk:
            raise InvalidRequestError("bridge mode needs the ZooKeeper connect string (--zk)")
        if self.mode == target and (target != BRIDGE or zk == self.zk):
            return Result([], (False, self.mode))
        if target not in _TRANSITIONS[self.mode]:
            raise InvalidRequestError(f"cannot {action} from migration mode {self.mode or 'none'}")
        return Result([MigrationStateRecord(mode=target, zk=zk, timestamp_ms=now_ms)], (True, target))

    def check_allocation(self, start: int, length: int) -> None:
        """Replay-side guard for a block (or one-ID block) about to be committed."""
        if self.mode == ROLLED_BACK:
            raise InvariantViolation("allocation after rollback to ZooKeeper")
        if self.mode == BRIDGE and start + length > self.reserved_until:
            raise InvariantViolation(
                f"bridge mode: block [{start}, {start + length}) is not inside the ZooKeeper reservation "
                f"(reserved below {self.reserved_until})")

    def replay(self, rec: Record, cursor: int) -> int | None:
        """Apply; returns a new cursor for a reservation."""
        if isinstance(rec, MigrationCursorRecord):  # snapshot restore
            if self.mode is not None:
                raise InvariantViolation("a migration cursor over an existing migration state")
            self.mode, self.zk, self.reserved_until = rec.mode, rec.zk, rec.reserved_until
            return None
        if isinstance(rec, MigrationStateRecord):
            if rec.mode not in _TRANSITIONS or rec.mode not in _TRANSITIONS[self.mode] and rec.mode != self.mode:
                raise InvariantViolation(f"migration mode {self.mode} cannot become {rec.mode}")
            if rec.mode == BRIDGE and self.mode != BRIDGE:
                self.reserved_until = cursor  # nothing reserved yet
            self.mode, self.zk = rec.mode, rec.zk
            return None
        if isinstance(rec, BridgeReservationRecord):
            if self.mode != BRIDGE:
                raise InvariantViolation("a ZooKeeper reservation outside bridge mode")
            if rec.reserved_start < cursor or rec.reserved_end < rec.reserved_start:
                raise InvariantViolation(f"reservation [{rec.reserved_start}, {rec.reserved_end}] is below the "
                                         f"next producer ID {cursor} or empty")
            self.reserved_until = rec.reserved_end + 1
            return rec.reserved_start
        raise TypeError(f"not a migration record: {rec!r}")  # pragma: no cover

    def snapshot_records(self) -> list[Record]:
        if self.mode is None:
            return []
        return [MigrationCursorRecord(mode=self.mode, zk=self.zk, reserved_until=self.reserved_until)]

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "zk": self.zk, "reserved_until": self.reserved_until}
