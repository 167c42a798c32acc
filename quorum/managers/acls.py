"""Access-control entries: ``quorum.security.acl`` decides; this slice stores them."""
from __future__ import annotations


from records import (
    AclRecord,
    Record,
    RemoveAclRecord,
)
from quorum.security.acl import Acl, AclError, AclIndex
from records.wire.errors import (
    InvalidRequestError,
    InvariantViolation,
)

from .base import Result


class AclManager:
    """The ACL entries, keyed by all their fields (the timestamp is audit only)."""

    def __init__(self) -> None:
        self.entries: dict[Acl, AclRecord] = {}
        self._index: AclIndex | None = None

    def acls(self) -> list[Acl]:
        return sorted(self.entries)

    def index(self) -> AclIndex:
        """The entries grouped for checks; rebuilt after a change (read it under the state's lock)."""
        if self._index is None:
            self._index = AclIndex(self.entries)
        return self._index

    def fork(self) -> "AclManager":
        out = AclManager()
        out.entries = dict(self.entries)  # entries are frozen
        return out

    def generate_alter(self, action: str, acl: Acl, now_ms: int) -> Result:
        """Response: changed (False: already there for add, absent for remove; nothing is committed)."""
        if action not in ("add", "remove"):
            raise InvalidRequestError(f"unknown ACL action {action!r} (add, remove)")
        try:
            acl.validate()
        except AclError as e:
            raise InvalidRequestError(str(e)) from None
        present = acl in self.entries
        if (action == "add") == present:
            return Result([], False)
        cls = AclRecord if action == "add" else RemoveAclRecord
        return Result([cls(**acl.to_dict(), timestamp_ms=now_ms)], True)

    def replay(self, rec: Record) -> None:
        acl = Acl.from_obj(rec)
        try:
            acl.validate()
        except AclError as e:
            raise InvariantViolation(f"invalid ACL entry: {e}") from None
        if isinstance(rec, AclRecord):
            if acl in self.entries:
                raise InvariantViolation(f"ACL entry {acl} already exists")
            self.entries[acl] = rec
            self._index = None
        elif isinstance(rec, RemoveAclRecord):
            if acl not in self.entries:
                raise InvariantViolation(f"ACL entry {acl} does not exist")
            del self.entries[acl]
            self._index = None
        else:  # pragma: no cover - dispatch bug
            raise TypeError(f"not an ACL record: {rec!r}")

    def snapshot_records(self) -> list[Record]:
        return [self.entries[a] for a in sorted(self.entries)]
