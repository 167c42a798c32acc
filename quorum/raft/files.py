"""A node's Raft files at start-up: the snapshot and the journal, made to agree, and what they say the
node may have lost (``docs/durability.md`` draws every state the write discipline can leave)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from snapshots.format import Snapshot
from snapshots.store import SnapshotStore
from snapshots.storage.disk import CorruptFileError, Disk

from ..journal import UNKNOWN_INDEX, DurableJournal, Position


def reconcile(journal: DurableJournal, snap: Snapshot | None, journal_path: str, snapshot_path: str) -> str | None:
    """Make the journal and the snapshot agree at start, finishing an interrupted compaction or install.

    Every state the write discipline can leave is explained and repaired (``docs/durability.md``); any
    other combination is refused with ``CorruptFileError`` naming both files.  Returns what was done
    (for the log), or None if nothing had to be.
    """
    entries = journal.entries
    if snap is None:
        if entries and entries[0][1] != 1:
            raise CorruptFileError(journal_path, f"the journal starts at index {entries[0][1]}, but there is no "
                                                 f"{snapshot_path} to hold the entries before it")
        return None
    last, prev = snap.last_entry, snap.prev_entry
    if entries and entries[0][1] > prev[1]:
        raise CorruptFileError(journal_path, f"the journal starts at index {entries[0][1]}, after the snapshot "
                                             f"{snapshot_path}, which ends at index {last[1]} (it must start at "
                                             f"{prev[1]}): entries are in neither file")
    if entries and entries[0][1] == prev[1] and len(entries) >= 2 and entries[0][2] == prev[2] \
            and entries[1][1] == last[1] and entries[1][2] == last[2]:
        return None  # the usual state: the journal starts with the snapshot's two entries
    first = entries[0][1] if entries else None
    dropped = journal.rebase(prev, last)
    if first is None:
        return f"the journal was empty: it now starts at the snapshot's last index {last[1]}"
    if dropped:
        return (f"the journal disagreed with the snapshot at index {last[1]}: dropped {dropped} entries after it "
                f"(never committed; an interrupted snapshot install)")
    return f"finished an interrupted compaction: the journal now starts at index {prev[1]} (it started at {first})"


@dataclass
class NodeFiles:
    """A node's Raft files as start-up leaves them: the snapshot store (and snapshot, if any) and the
    journal, made to agree (``reconcile``); ``note`` says what start-up had to repair."""

    store: SnapshotStore
    snapshot: Snapshot | None
    journal: DurableJournal
    note: str | None


def open_node_files(disk: Disk, data_dir: str) -> NodeFiles:
    """What a node does with its Raft files before it takes part in Raft (CorruptFileError if they
    cannot be explained)."""
    journal_path = os.path.join(data_dir, "raft.journal")
    snapshot_path = os.path.join(data_dir, "raft.snapshot")
    store = SnapshotStore(snapshot_path, disk)
    snap = store.load()
    journal = DurableJournal(journal_path, disk)
    note = reconcile(journal, snap, journal_path, snapshot_path)
    return NodeFiles(store, snap, journal, note)


def loss_evidence(journal: DurableJournal, snap: Snapshot | None, identity_existed: bool,
                  data_dir: str) -> list[tuple[Position, str]]:
    """What a node's own files say it may have lost: (position it must reach again, why) pairs.

    * the journal ends below the log end or the commit index the meta file recorded as durable
      (a disk that lost synced writes, a journal cut by a fault);
    * the meta file (term and vote) is gone while the log holds more than its first entry;
    * the data directory kept its identity but lost its Raft files.
    A position with index ``UNKNOWN_INDEX`` is reached only by an entry of a newer term.
    """
    end = journal.durable_end()
    found: list[tuple[Position, str]] = []
    meta_end = journal.meta_log_end()
    if meta_end is not None and meta_end > end:
        found.append((meta_end, f"the journal ends at {fmt_position(end)}, but {journal.path}.meta recorded "
                                f"{fmt_position(meta_end)} as durable"))
    commit = journal.getRaftCommitIndex() if not journal.meta_missing else 0
    if commit > end[1]:
        found.append(((journal.meta_term(), commit), f"the journal ends at index {end[1]}, below the durable "
                                                     f"commit index {commit}"))
    if journal.meta_missing and (end[1] > 1 or snap is not None):
        found.append(((end[0], UNKNOWN_INDEX), f"{journal.path}.meta (term and vote) is missing"))
    if identity_existed and journal.file_was_missing and snap is None:
        found.append(((journal.meta_term(), UNKNOWN_INDEX), f"{data_dir} has an identity but lost its Raft files "
                                                            f"(raft.journal, raft.snapshot)"))
    return found



def fmt_position(pos) -> str:
    if pos is None:
        return "nothing"
    term, index = pos
    return f"term {term} index {'?' if index >= UNKNOWN_INDEX else index}"
