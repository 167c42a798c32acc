"""The partitions of the transaction simulation: a small model of ``broker.partition.Partition``'s
transactional behaviour, in memory.

The real ``Partition`` writes segment files through ``os`` and runs a snapshot thread, neither of which
the simulation can run deterministically on its simulated disk, so the rules that matter to
transactions are modelled here, one for one with ``Partition`` and ``ProducerStateManager`` (KIP-98,
KIP-890 part 1).  The rules are listed in docs/simulation.md, section 7, "What is modelled".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from records.wire.errors import Errors, UnknownTopicOrPartitionError


@dataclass
class Entry:
    offset: int
    kind: str          # "data", "commit" or "abort"
    producer_id: int
    epoch: int
    value: str | None = None
    transactional: bool = False


@dataclass
class MarkerResult:
    """What ``TxnCoordinator._write_marker`` reads of ``Partition.write_marker``'s ``AppendResult``."""
    error: Errors = Errors.NONE
    message: str = ""
    duplicate: bool = False
    base_offset: int = -1


class ModelPartition:
    def __init__(self, topic: str, index: int):
        self.topic, self.index = topic, index
        self.log: list[Entry] = []
        self.epochs: dict[int, int] = {}                    # producer id -> its epoch here
        self.ongoing: dict[int, tuple[int, int]] = {}       # producer id -> (epoch, first offset), oldest first
        self.aborted: list[tuple[int, int, int]] = []       # (producer id, first offset, marker offset)
        self._expecting: dict[int, tuple[int, int]] = {}    # producer id -> (epoch, token): in memory
        self._tokens = count(1)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.index}"

    # ---------------------------------------------------------------- writes
    def expect_transaction(self, producer_id: int, producer_epoch: int) -> int:
        token = next(self._tokens)
        self._expecting[producer_id] = (producer_epoch, token)
        return token

    def append(self, producer_id: int, epoch: int, value: str, token: int | None) -> tuple[Errors, str, int]:
        """A transactional batch of one record: (error, message, offset)."""
        allowed = self._expecting.get(producer_id) == (epoch, token) or producer_id in self.ongoing
        if not allowed:
            return Errors.INVALID_TXN_STATE, "partition not added to an ongoing transaction", -1
        current = self.epochs.get(producer_id, -1)
        if epoch < current:
            return Errors.INVALID_PRODUCER_EPOCH, f"epoch {epoch} is older than {current}", -1
        txn = self.ongoing.get(producer_id)
        if txn is not None and txn[0] != epoch:
            return Errors.INVALID_PRODUCER_EPOCH, f"a transaction of epoch {txn[0]} is ongoing", -1
        offset = len(self.log)
        self.log.append(Entry(offset, "data", producer_id, epoch, value, True))
        self.epochs[producer_id] = epoch
        if txn is None:
            self.ongoing[producer_id] = (epoch, offset)
        return Errors.NONE, "", offset

    def write_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                     coordinator_epoch: int = 0, still_current=None) -> MarkerResult:
        if still_current is not None and not still_current():
            return MarkerResult(duplicate=True, message="the transaction has ended")
        self._expecting.pop(producer_id, None)
        txn = self.ongoing.get(producer_id)
        current = self.epochs.get(producer_id, -1)
        if txn is not None:
            current = max(current, txn[0])
        if producer_epoch < current:
            return MarkerResult(Errors.INVALID_PRODUCER_EPOCH,
                                f"marker epoch {producer_epoch} is older than the current epoch {current}")
        known = producer_id in self.epochs
        if txn is None and not (known and producer_epoch > current):
            return MarkerResult(duplicate=True, message="no transaction ongoing")
        offset = len(self.log)
        self.log.append(Entry(offset, "commit" if commit else "abort", producer_id, producer_epoch))
        self.epochs[producer_id] = producer_epoch
        if txn is not None:
            del self.ongoing[producer_id]
            if not commit:
                self.aborted.append((producer_id, txn[1], offset))
        return MarkerResult(base_offset=offset)

    def crash(self) -> None:
        """The broker process died: the log and the producer state (snapshots plus replay) stay, the
        KIP-890 tokens of checks under way are gone."""
        self._expecting.clear()

    # ----------------------------------------------------------------- reads
    @property
    def high_watermark(self) -> int:
        return len(self.log)

    @property
    def last_stable_offset(self) -> int:
        for _, first in self.ongoing.values():
            return first  # dicts keep insertion order: the oldest ongoing transaction first
        return self.high_watermark

    def _aborted_offsets(self) -> set[int]:
        out = set()
        for pid, first, end in self.aborted:
            out.update(e.offset for e in self.log[first:end] if e.producer_id == pid and e.kind == "data")
        return out

    def read_committed(self) -> list[Entry]:
        aborted = self._aborted_offsets()
        return [e for e in self.log[:self.last_stable_offset] if e.kind == "data" and e.offset not in aborted]

    def read_uncommitted(self) -> list[Entry]:
        return [e for e in self.log if e.kind == "data"]


@dataclass
class TopicInfo:
    name: str
    partitions: int


@dataclass
class ModelStorage:
    """The ``Storage`` interface ``TxnCoordinator`` uses (``topic``, ``partition``), over model partitions."""
    topics: dict[str, list[ModelPartition]] = field(default_factory=dict)

    def add_topic(self, name: str, partitions: int) -> None:
        self.topics[name] = [ModelPartition(name, i) for i in range(partitions)]

    def topic(self, name: str) -> TopicInfo | None:
        parts = self.topics.get(name)
        return None if parts is None else TopicInfo(name, len(parts))

    def partition(self, topic: str, index: int) -> ModelPartition:
        parts = self.topics.get(topic)
        if parts is None or not 0 <= index < len(parts):
            raise UnknownTopicOrPartitionError(f"{topic}-{index}")
        return parts[index]

    def all(self) -> list[ModelPartition]:
        return [p for parts in self.topics.values() for p in parts]
