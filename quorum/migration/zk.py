"""Kafka's ZooKeeper-mode producer-ID blocks: parse, read, allocate, reserve, roll back.

The znode's format, Kafka's allocation loop, and what this module does differently (strict parsing, a write
of unknown outcome read back rather than assumed) are in docs/migration.md, "Appendix: the znode and how
pidquorum reads it".
"""
from __future__ import annotations

import json
import re
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KeeperState

ZK_BLOCK_PATH = "/latest_producer_id_block"
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
PLACEHOLDER_BROKER = -1
DEFAULT_BLOCK_SIZE = 1000
BLOCK_DATA_VERSION = 1

# A request whose answer never came back: it may or may not have been applied.
# (ConnectionClosedError is a SessionExpiredError.)
UNKNOWN_OUTCOME_ERRORS = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)

_CANONICAL = re.compile(r"0|[1-9][0-9]*")
_NEGATIVE = re.compile(r"-(0|[1-9][0-9]*)")


# ---------------------------------------------------------------- errors
class ZkMigrationError(Exception):
    """Base class for this module's errors."""


class ZkBlockError(ZkMigrationError, ValueError):
    """The block data is malformed; ``field`` names what is wrong."""

    def __init__(self, origin: str, field: str, problem: str):
        self.origin = origin
        self.field = field
        self.problem = problem
        super().__init__(f"{origin}: field {field!r}: {problem}")


class ZkBlockMissing(ZkMigrationError):
    """The znode does not exist (ZooKeeper-mode Kafka never allocated a block, or wrong chroot)."""

    def __init__(self, path: str = ZK_BLOCK_PATH, where: str = ""):
        self.path = path
        at = f" at {where}" if where else ""
        super().__init__(
            f"znode {path} does not exist{at}: ZooKeeper-mode Kafka has not allocated any producer-ID "
            f"block there (wrong host or chroot?); use --allow-empty if an empty start is intended")


class ZkBlocksExhausted(ZkMigrationError):
    """No block of the requested size fits below Long.MAX."""


class ZkConflict(ZkMigrationError):
    """A write conditional on ``expected_version`` found another version."""

    def __init__(self, expected_version: int, actual_version: int | None):
        self.expected_version = expected_version
        self.actual_version = actual_version
        now = "absent" if actual_version is None else f"at version {actual_version}"
        super().__init__(f"znode {ZK_BLOCK_PATH} changed: expected version {expected_version}, it is {now}")


class ZkUnavailable(ZkMigrationError):
    """ZooKeeper could not be reached (in time)."""


# ---------------------------------------------------------------- block data
@dataclass(frozen=True)
class ZkBlock:
    version: int
    broker: int
    block_start: int
    block_end: int  # inclusive

    @property
    def next_start(self) -> int:
        return self.block_end + 1

    @property
    def length(self) -> int:
        return self.block_end - self.block_start + 1

    def to_json(self) -> bytes:
        """The znode data, as Kafka writes it."""
        return json.dumps(
            {"version": self.version, "broker": self.broker,
             "block_start": str(self.block_start), "block_end": str(self.block_end)},
            separators=(",", ":")).encode()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_duplicates(origin: str):
    def hook(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise ZkBlockError(origin, key, "appears more than once")
            seen[key] = value
        return seen
    return hook


def _no_constants(origin: str):
    def hook(name):
        raise ZkBlockError(origin, "data", f"invalid JSON: {name} is not a JSON number")
    return hook


def _parse_long_string(origin: str, field: str, value) -> int:
    if not isinstance(value, str):
        kind = "a number" if _is_int(value) or isinstance(value, float) else type(value).__name__
        if value is None:
            kind = "null"
        raise ZkBlockError(origin, field, f"must be a string of decimal digits (Kafka writes e.g. \"4000\"), "
                                          f"got {kind} {json.dumps(value)}")
    shown = json.dumps(value if len(value) <= 40 else value[:40] + "...")
    if _NEGATIVE.fullmatch(value):
        raise ZkBlockError(origin, field, f"is negative: {shown}")
    if not (value.isascii() and _CANONICAL.fullmatch(value)):
        if value.isascii() and re.fullmatch(r"0[0-9]+", value):
            raise ZkBlockError(origin, field, f"has leading zeros: {shown} (Kafka writes canonical decimal; "
                                              f"refused rather than guessed at)")
        raise ZkBlockError(origin, field, f"is not a decimal integer: {shown} (digits 0-9 only, no sign, "
                                          f"spaces, fraction or exponent)")
    if len(value) > 19 or int(value) > LONG_MAX:
        raise ZkBlockError(origin, field, f"is beyond Long.MAX ({LONG_MAX}): {shown}")
    return int(value)


def parse_block(data: bytes | None, origin: str) -> ZkBlock | None:
    """Parse ``/latest_producer_id_block`` data (from the znode or a JSON export).

    Returns None for empty data (a node Kafka created without a block yet).
    Raises :class:`ZkBlockError` naming the field for anything else that is
    not a well-formed version-1 block (the rules: docs/migration.md, the appendix).
    """
    if data is None or data == b"":
        return None
    if isinstance(data, str):
        data = data.encode()
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ZkBlockError(origin, "data", f"not UTF-8 text: {e}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates(origin), parse_constant=_no_constants(origin))
    except json.JSONDecodeError as e:
        raise ZkBlockError(origin, "data", f"invalid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ZkBlockError(origin, "data", f"must be a JSON object, got {type(doc).__name__}")
    for field in ("version", "broker", "block_start", "block_end"):
        if field not in doc:
            raise ZkBlockError(origin, field, "missing")
    version = doc["version"]
    if not _is_int(version):
        raise ZkBlockError(origin, "version", f"must be an integer, got {json.dumps(version)}")
    if version != BLOCK_DATA_VERSION:
        raise ZkBlockError(origin, "version", f"unknown version {version} (only version {BLOCK_DATA_VERSION} "
                                              f"is understood)")
    broker = doc["broker"]
    if not _is_int(broker):
        raise ZkBlockError(origin, "broker", f"must be an integer, got {json.dumps(broker)}")
    if broker < PLACEHOLDER_BROKER or broker > INT_MAX:
        raise ZkBlockError(origin, "broker", f"out of range: {broker} (a broker id is 0..{INT_MAX}, "
                                             f"or -1 for a placeholder block)")
    start = _parse_long_string(origin, "block_start", doc["block_start"])
    end = _parse_long_string(origin, "block_end", doc["block_end"])
    if end < start:
        raise ZkBlockError(origin, "block_end", f"{end} is below block_start {start} (block_end is inclusive)")
    return ZkBlock(version=version, broker=broker, block_start=start, block_end=end)


def _check_range(start: int, length: int) -> int:
    if not _is_int(start) or start < 0:
        raise ValueError(f"block start must be a non-negative integer, got {start!r}")
    if not _is_int(length) or length < 1:
        raise ValueError(f"block length must be a positive integer, got {length!r}")
    end = start + length - 1
    if end > LONG_MAX:
        raise ZkBlocksExhausted(f"block [{start}, {end}] goes beyond Long.MAX ({LONG_MAX})")
    return end


# ---------------------------------------------------------------- connecting
def connect(hosts: str, timeout: float = 10.0, *, ensure_chroot: bool = False) -> KazooClient:
    """A started KazooClient for ``HOST:PORT[,HOST:PORT...][/chroot]``.

    With ``ensure_chroot=True`` a missing chroot is created first (through a
    client without chroot); otherwise it is left as it is (reads under a
    missing chroot then find no znode). Raises :class:`ZkUnavailable` if no
    session is established within ``timeout`` seconds.
    """
    servers, _, chroot = hosts.partition("/")
    chroot = "/" + chroot.strip("/") if chroot.strip("/") else ""
    if ensure_chroot and chroot:
        root = _start(servers, timeout)
        try:
            root.ensure_path(chroot)
        finally:
            root.stop()
            root.close()
    return _start(servers + chroot, timeout)


def _start(hosts: str, timeout: float) -> KazooClient:
    # Reconnect promptly after an outage (kazoo's default backoff grows to an hour).
    zk = KazooClient(hosts=hosts, timeout=timeout,
                     connection_retry=dict(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0))
    try:
        with warnings.catch_warnings():  # kazoo warns about a missing chroot: our callers decide
            warnings.simplefilter("ignore")
            zk.start(timeout=timeout)
    except KazooTimeoutError:  # kazoo has stopped and closed the client
        raise ZkUnavailable(f"no ZooKeeper session with {hosts} within {timeout}s") from None
    return zk


# ---------------------------------------------------------------- reading
def read_block(zk: KazooClient, op_timeout: float | None = None) -> tuple[ZkBlock | None, int]:
    """(block or None if the node is empty, znode version). A missing node raises :class:`ZkBlockMissing`.

    Connection errors propagate (kazoo's ConnectionLoss etc.).
    """
    try:
        data, stat = zk.get_async(ZK_BLOCK_PATH).get(timeout=op_timeout)
    except NoNodeError:
        raise ZkBlockMissing(ZK_BLOCK_PATH, _where(zk)) from None
    return parse_block(data, _origin(zk)), stat.version


def export_block(hosts: str, timeout: float) -> tuple[bytes, ZkBlock, int]:
    """``pidctl migrate export``: the znode's data exactly as ZooKeeper holds it, validated in the same
    read (the bytes returned are the bytes parsed): (data, block, znode version).  A missing or empty
    znode, or malformed data, raises :class:`ZkMigrationError`."""
    zk = connect(hosts, timeout)
    try:
        data, stat = zk.get_async(ZK_BLOCK_PATH).get(timeout=timeout)
    except NoNodeError:
        data = stat = None
    except UNKNOWN_OUTCOME_ERRORS as e:
        raise ZkUnavailable(f"reading {ZK_BLOCK_PATH} at {hosts} failed: {type(e).__name__}") from None
    finally:
        zk.stop()
        zk.close()
    if stat is None:
        raise ZkMigrationError(f"znode {ZK_BLOCK_PATH} does not exist at {hosts}: ZooKeeper-mode Kafka has not "
                               f"allocated any producer-ID block there (wrong host or chroot?); nothing exported")
    block = parse_block(data, f"znode {ZK_BLOCK_PATH} ({hosts})")
    if block is None:
        raise ZkMigrationError(f"znode {ZK_BLOCK_PATH} at {hosts} holds no block (empty data); nothing exported")
    return data, block, stat.version


def allocate_legacy(hosts: str, broker_id: int, count: int, timeout: float,
                    on_block: Callable[[int, int], None]) -> None:
    """``pidctl migrate zk-allocate``: ``count`` blocks the ZooKeeper way, as a broker that has not moved
    to the quorum does; ``on_block(start, length)`` for each as it is taken (blocks taken before a
    failure are spent in ZooKeeper either way)."""
    zk = connect(hosts, timeout)
    try:
        allocator = LegacyAllocator(zk, broker_id, timeout=timeout, op_timeout=min(2.0, timeout))
        for _ in range(count):
            on_block(*allocator.allocate())
    except ZkBlockMissing:
        raise ZkMigrationError(f"cannot create {ZK_BLOCK_PATH} at {hosts}: the chroot does not exist "
                               f"(wrong chroot?)") from None
    finally:
        zk.stop()
        zk.close()


def _where(zk: KazooClient) -> str:
    chroot = getattr(zk, "chroot", "") or ""
    return f"{','.join(f'{h}:{p}' for h, p in getattr(zk, 'hosts', []))}{chroot}"


def _origin(zk: KazooClient) -> str:
    return f"znode {ZK_BLOCK_PATH} ({_where(zk)})"


# ---------------------------------------------------------------- the conditional-write loop
@dataclass(frozen=True)
class WriteResult:
    written: bool          # False: the znode already satisfied the request; nothing was written
    block: ZkBlock | None  # what the znode holds now (our block when written)
    version: int           # its znode version
    claimed_unknown: bool = False  # written, learned by re-reading after an unknown outcome


class _Stats:
    def __init__(self):
        self.writes = 0            # conditional writes sent (create or setData)
        self.retries = 0           # times the loop started over (lost race, reconnect, not-ours after unknown)
        self.unknown_outcomes = 0  # writes whose answer never came (connection loss/expiry/timeout)


_KEEP = object()


def _advance(zk: KazooClient, decide: Callable[[ZkBlock | None], ZkBlock | object], *,
             expected_version: int | None = None, timeout: float = 60.0, op_timeout: float = 10.0,
             stats: _Stats | None = None, allow_create: bool = True) -> WriteResult:
    """Read the znode, let ``decide(current)`` pick the block to write (or _KEEP), write it
    conditionally; start over on a lost race. The znode is created when absent (if ``allow_create``).

    With ``expected_version`` the write happens only on that version (``-1``: the node must be absent);
    anything else raises :class:`ZkConflict`.

    An unknown outcome leaves a *pending* write (bytes, version it would produce). Every later read
    checks it first: the znode holding exactly those bytes at exactly that version means the write was
    applied, and it is claimed. Nobody else can have written the same bytes at that version: the data
    holds the writer's broker id, and two writers only compute the same block from the same znode
    version. (Remaining ambiguity: two writers sharing a broker id, a misconfiguration Kafka forbids.)
    Once the znode has reached that version with other bytes, the pending write can never apply.
    """
    stats = stats or _Stats()
    deadline = time.monotonic() + timeout
    pending: tuple[bytes, int] | None = None
    last_error: Exception | None = None
    while True:
        if time.monotonic() > deadline:
            raise ZkUnavailable(f"no conclusive write to {ZK_BLOCK_PATH} within {timeout}s "
                                f"(last error: {last_error!r})")
        _wait_connected(zk, deadline)
        try:
            data, stat = zk.get_async(ZK_BLOCK_PATH).get(timeout=op_timeout)
            version = stat.version
        except NoNodeError:
            data, version = None, -1
        except UNKNOWN_OUTCOME_ERRORS as e:
            last_error = e
            stats.retries += 1
            time.sleep(0.05)
            continue
        if pending is not None:
            if data == pending[0] and version == pending[1]:
                return WriteResult(True, parse_block(data, _origin(zk)), version, claimed_unknown=True)
            if version >= pending[1] or (data is None and pending[1] > 0):
                pending = None  # the znode moved past the version our write needed: it can never apply
        if expected_version is not None and version != expected_version:
            raise ZkConflict(expected_version, None if data is None else version)
        current = parse_block(data, _origin(zk)) if data is not None else None
        target = decide(current)
        if target is _KEEP:
            return WriteResult(False, current, version)
        new = target.to_json()
        try:
            stats.writes += 1
            if data is None:
                if not allow_create:
                    raise ZkBlockMissing(ZK_BLOCK_PATH, _where(zk))
                try:
                    zk.create_async(ZK_BLOCK_PATH, new).get(timeout=op_timeout)
                except NoNodeError:
                    raise ZkBlockMissing(f"parent of {ZK_BLOCK_PATH}", _where(zk)) from None
                new_version = 0
            else:
                new_version = zk.set_async(ZK_BLOCK_PATH, new, version=version).get(timeout=op_timeout).version
            return WriteResult(True, target, new_version)
        except (BadVersionError, NodeExistsError, NoNodeError) as e:
            # Lost a race (or the node was deleted under us): start over from what is there now.
            # With expected_version, the next read raises ZkConflict (or finds a pending write of ours).
            last_error = e
            stats.retries += 1
        except UNKNOWN_OUTCOME_ERRORS as e:
            last_error = e
            stats.unknown_outcomes += 1
            stats.retries += 1
            pending = (new, version + 1)


def _wait_connected(zk: KazooClient, deadline: float) -> None:
    """Don't queue requests while kazoo is reconnecting (they would wait for the session)."""
    while zk.state != KazooState.CONNECTED and time.monotonic() < deadline:
        if zk.client_state == KeeperState.CLOSED:
            raise ZkUnavailable("the kazoo client is stopped")
        time.sleep(0.02)


# ---------------------------------------------------------------- legacy allocation
class LegacyAllocator:
    """Kafka's ZooKeeper-mode producer-ID allocation, done right.

    ``allocate()`` reads the znode's data and version, computes the next block
    (``[block_end + 1, block_end + block_size]``, or ``[0, block_size - 1]``
    when the node is absent or empty), and writes it with a conditional setData
    (create when absent). A lost race (BadVersion, NodeExists) starts over.

    A write whose answer is lost (ConnectionLoss, SessionExpired, a timeout)
    may or may not have been applied. It is never assumed either way: once the
    client is connected again the znode is re-read; if it holds exactly the
    bytes we wrote at exactly our version + 1, the block is ours and returned;
    otherwise the loop starts over from the new contents (our write can no
    longer apply: the version moved). A write applied after a later re-read
    (possible with an ensemble, where a request can still be in flight) is
    claimed by the same check at the next read; at worst a block that nobody
    returned is skipped (wasted, never issued twice). The remaining ambiguity
    would be another writer writing byte-identical data at the same version,
    impossible because the data holds the broker id — unless two brokers share
    an id, which Kafka forbids.

    Counters: ``writes`` (conditional writes sent), ``retries`` (loop
    restarts), ``unknown_outcomes`` (writes whose answer never came),
    ``allocated`` (blocks returned). One allocator may be shared by threads
    (calls are serialized); use separate allocators for concurrency.
    """

    def __init__(self, zk: KazooClient, broker_id: int, block_size: int = DEFAULT_BLOCK_SIZE, *,
                 timeout: float = 60.0, op_timeout: float = 10.0):
        if not _is_int(broker_id) or not 0 <= broker_id <= INT_MAX:
            raise ValueError(f"broker id must be 0..{INT_MAX}, got {broker_id!r}")
        if not _is_int(block_size) or block_size < 1:
            raise ValueError(f"block size must be a positive integer, got {block_size!r}")
        self.zk = zk
        self.broker_id = broker_id
        self.block_size = block_size
        self.timeout = timeout
        self.op_timeout = op_timeout
        self._stats = _Stats()
        self.allocated = 0
        self._lock = threading.Lock()

    writes = property(lambda self: self._stats.writes)
    retries = property(lambda self: self._stats.retries)
    unknown_outcomes = property(lambda self: self._stats.unknown_outcomes)

    def next_block(self, current: ZkBlock | None) -> ZkBlock:
        if current is None:
            start = 0
        else:
            if current.block_end > LONG_MAX - self.block_size:
                raise ZkBlocksExhausted(
                    f"producer-ID blocks exhausted: the last block ends at {current.block_end}, "
                    f"above Long.MAX - {self.block_size}")
            start = current.next_start
        return ZkBlock(BLOCK_DATA_VERSION, self.broker_id, start, start + self.block_size - 1)

    def allocate(self) -> tuple[int, int]:
        """Allocate the next block: (start, length)."""
        with self._lock:
            result = _advance(self.zk, self.next_block, timeout=self.timeout, op_timeout=self.op_timeout,
                              stats=self._stats)
            self.allocated += 1
            return result.block.block_start, result.block.length


# ---------------------------------------------------------------- rollback placeholder
def write_placeholder(zk: KazooClient, start: int, length: int = DEFAULT_BLOCK_SIZE, *,
                      timeout: float = 60.0, op_timeout: float = 10.0) -> WriteResult:
    """Write the placeholder block [start, start + length - 1] with broker -1 (rollback to ZooKeeper).

    Never moves the znode backwards: if it already holds a block ending at or
    above the placeholder's end, nothing is written and the result says so
    (``written=False``, with the block found). Conditional update loop, with
    unknown outcomes resolved by re-reading as in :class:`LegacyAllocator`.
    """
    end = _check_range(start, length)
    placeholder = ZkBlock(BLOCK_DATA_VERSION, PLACEHOLDER_BROKER, start, end)

    def decide(current: ZkBlock | None):
        if current is not None and current.block_end >= end:
            return _KEEP
        return placeholder

    return _advance(zk, decide, timeout=timeout, op_timeout=op_timeout)


def describe_placeholder(result: WriteResult, start: int, length: int) -> str:
    end = start + length - 1
    if result.written:
        return f"wrote placeholder block [{start}, {end}] (broker -1) to {ZK_BLOCK_PATH}, znode version {result.version}"
    b = result.block
    return (f"left {ZK_BLOCK_PATH} as it is: it already holds block [{b.block_start}, {b.block_end}] "
            f"(broker {b.broker}), at or above the placeholder's end {end}")


# ---------------------------------------------------------------- bridge-mode reservation
def reserve_block(zk: KazooClient, min_start: int, length: int, expected_version: int | None = None, *,
                  broker_id: int, timeout: float = 60.0, op_timeout: float = 10.0) -> tuple[int, int]:
    """Reserve [start, start + length - 1] in the znode for ``broker_id``; returns (start, new znode version).

    ``start = max(min_start, block_end + 1)`` of the block the znode holds (``min_start`` when it is
    absent or empty), written with a conditional update, so a ZooKeeper-mode broker allocating
    concurrently continues above it. Without ``expected_version`` a lost race re-reads and retries;
    with it, the write happens only on that znode version (``-1``: absent) and anything else raises
    :class:`ZkConflict`. Unknown outcomes are resolved by re-reading (see :class:`LegacyAllocator`).
    """
    _check_range(min_start, length)
    if not _is_int(broker_id) or not PLACEHOLDER_BROKER <= broker_id <= INT_MAX:
        raise ValueError(f"broker id must be -1..{INT_MAX}, got {broker_id!r}")

    def decide(current: ZkBlock | None):
        start = min_start if current is None else max(min_start, current.next_start)
        return ZkBlock(BLOCK_DATA_VERSION, broker_id, start, _check_range(start, length))

    result = _advance(zk, decide, expected_version=expected_version, timeout=timeout, op_timeout=op_timeout)
    return result.block.block_start, result.version
