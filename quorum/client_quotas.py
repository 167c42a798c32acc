"""Client quotas as replicated state (Kafka's /config/users/<user> and /config/users/<default>).

One manager, ``ClientQuotaManager``, owns the quota configuration: for each user
(a principal name without its ``User:`` prefix) and for the user default, a map
of quota keys to values.  It follows the managers' rules (quorum/managers/):
``generate_alter`` reads and returns records, ``replay`` is the only mutation and
checks every invariant, a snapshot is the live quotas as records again.

Keys: ``producer_ids_rate`` (KIP-936), the new producer IDs per second a
principal may start producing with; a broker throttles a principal over it
(broker/quota.py).  A user's own value wins over the default; with neither, the
principal is not limited.
"""
from __future__ import annotations

import math
import re
from typing import Any

from records import ClientQuotaRecord, Record
from records.wire.errors import InvalidRequestError, InvariantViolation

PRODUCER_IDS_RATE = "producer_ids_rate"
QUOTA_KEYS: dict[str, str] = {
    PRODUCER_IDS_RATE: "new producer IDs per second a principal may start producing with (KIP-936)",
}
# Far above anything a quorum hands out (blocks of 1000 IDs, a few thousand blocks/s), low
# enough that a broker's filter sized from it stays in memory (broker/quota.py caps it too).
MAX_RATE = 1_000_000.0
MAX_USER_CHARS = 255
PRINCIPAL_TYPE = "User:"
# A SASL user name: printable ASCII, no spaces, no separators Kafka's tools use.
_USER = re.compile(r"[A-Za-z0-9._@+=/~!#$%&*^|-]+")
DEFAULT_NAME = "<default>"


def parse_user(user: Any) -> str | None:
    """``alice`` or ``User:alice`` -> ``alice``; None -> None (the default).  InvalidRequestError otherwise."""
    if user is None:
        return None
    if not isinstance(user, str):
        raise InvalidRequestError(f"user must be a string, not {type(user).__name__}")
    name = user[len(PRINCIPAL_TYPE):] if user.startswith(PRINCIPAL_TYPE) else user
    if ":" in name:
        kind = name.split(":", 1)[0]
        raise InvalidRequestError(f"unknown principal type {kind + ':'!r} in {user!r} (quotas are per User:<name>)")
    if name == DEFAULT_NAME:
        raise InvalidRequestError(f"{DEFAULT_NAME!r} is not a user name; use the default entity (--default)")
    if not name or len(name) > MAX_USER_CHARS or not _USER.fullmatch(name):
        raise InvalidRequestError(
            f"bad user name {user!r}: 1..{MAX_USER_CHARS} printable ASCII characters without spaces, "
            "commas, colons or quotes")
    return name


def check_value(key: Any, value: Any) -> float:
    """The value of ``key`` as a float, or InvalidRequestError (unknown key, not a finite rate in range)."""
    if key not in QUOTA_KEYS:
        raise InvalidRequestError(f"unknown quota key {key!r} (known: {', '.join(sorted(QUOTA_KEYS))})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{key} must be a number, not {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidRequestError(f"{key} must be finite, not {value}")
    if not 0 < value <= MAX_RATE:
        raise InvalidRequestError(f"{key} {value:g} is not in (0, {MAX_RATE:g}] "
                                  "(to lift a quota, delete it)")
    return value


def entity_name(user: str | None) -> str:
    return DEFAULT_NAME if user is None else f"{PRINCIPAL_TYPE}{user}"


class ClientQuotaManager:
    def __init__(self) -> None:
        self.quotas: dict[str | None, dict[str, float]] = {}

    # -- reading --------------------------------------------------------------
    def get(self, user: str | None, key: str) -> float | None:
        return self.quotas.get(user, {}).get(key)

    def effective(self, user: str, key: str) -> tuple[float | None, str | None]:
        """(value, "user" | "default") that applies to ``user``; (None, None) if unlimited."""
        own = self.get(user, key)
        if own is not None:
            return own, "user"
        default = self.get(None, key)
        return (default, "default") if default is not None else (None, None)

    def entries(self) -> list[dict[str, Any]]:
        """Every entity with its values, the default first: [{"user": name | None, "values": {key: v}}]."""
        users = sorted(self.quotas, key=lambda u: (u is not None, u or ""))
        return [{"user": u, "values": dict(sorted(self.quotas[u].items()))} for u in users if self.quotas[u]]

    def fork(self) -> "ClientQuotaManager":
        """A scratch copy (the proposer forks the state for every batch): new dicts over the same floats."""
        other = ClientQuotaManager.__new__(ClientQuotaManager)
        other.quotas = {user: dict(values) for user, values in self.quotas.items()}
        return other

    # -- generate --------------------------------------------------------------
    def generate_alter(self, user: Any, key: Any, value: Any, remove: bool, now_ms: int) -> tuple[list[Record], bool]:
        """Records that set (or remove) ``key`` for ``user`` (None: the default), and whether anything changes."""
        user = parse_user(user)
        current = self.get(user, key) if isinstance(key, str) else None
        if remove:
            if key not in QUOTA_KEYS:
                raise InvalidRequestError(f"unknown quota key {key!r} (known: {', '.join(sorted(QUOTA_KEYS))})")
            if current is None:
                return [], False
            return [ClientQuotaRecord(user=user, key=key, remove=True, timestamp_ms=now_ms)], True
        value = check_value(key, value)
        if current == value:
            return [], False
        return [ClientQuotaRecord(user=user, key=key, value=value, remove=False, timestamp_ms=now_ms)], True

    # -- replay ----------------------------------------------------------------
    def replay(self, rec: Record) -> None:
        if not isinstance(rec, ClientQuotaRecord):  # pragma: no cover - dispatch bug
            raise TypeError(f"not a client quota record: {rec!r}")
        try:
            user = parse_user(rec.user)
            if rec.remove:
                if rec.key not in self.quotas.get(user, {}):
                    raise InvalidRequestError(f"{rec.key} is not set for {entity_name(user)}")
            else:
                value = check_value(rec.key, rec.value)
        except InvalidRequestError as e:
            raise InvariantViolation(f"client quota: {e.message}") from None
        if rec.remove:
            del self.quotas[user][rec.key]
            if not self.quotas[user]:
                del self.quotas[user]
        else:
            self.quotas.setdefault(user, {})[rec.key] = value

    def snapshot_records(self) -> list[Record]:
        return [ClientQuotaRecord(user=e["user"], key=k, value=v)
                for e in self.entries() for k, v in e["values"].items()]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientQuotaManager) and self.quotas == other.quotas


__all__ = ["ClientQuotaManager", "MAX_RATE", "PRODUCER_IDS_RATE", "QUOTA_KEYS", "check_value", "entity_name",
           "parse_user"]
