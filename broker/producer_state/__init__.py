"""Idempotent-producer state of one partition.  Its modules (table, rules, transactions, snapshot, manager;
each imports only those before it) and the design: docs/producer-state.md.
"""
from .manager import ProducerStateManager, read_snapshot
from .rules import APPEND, MAX_CACHED_BATCHES, Action, BatchMetadata, Decision, ProducerEntry
from .snapshot import (
    INT16_MAX,
    SNAPSHOT_FORMAT,
    SNAPSHOT_MAGIC,
    SNAPSHOT_SUFFIX,
    ProducerSnapshot,
    SnapshotCopy,
    install_snapshot,
    list_snapshots,
    snapshot_path,
)
from .table import DEFAULT_PRODUCER_ID_EXPIRATION_MS, DEFAULT_RETRY_WINDOW_MS, INT64_MAX, ROW, _bits_for
from .transactions import ABORTED, AbortedIndex

# The names the module had before it became a package (``_bits_for``: the tests size tables with it).
__all__ = ["ABORTED", "APPEND", "AbortedIndex", "Action", "BatchMetadata", "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
           "DEFAULT_RETRY_WINDOW_MS", "Decision", "INT16_MAX", "INT64_MAX", "MAX_CACHED_BATCHES", "ProducerEntry",
           "ProducerSnapshot", "ProducerStateManager", "ROW", "SNAPSHOT_FORMAT", "SNAPSHOT_MAGIC", "SNAPSHOT_SUFFIX",
           "SnapshotCopy", "_bits_for", "install_snapshot", "list_snapshots", "read_snapshot", "snapshot_path"]
