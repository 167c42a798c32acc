"""What the replication rules (``replication``, ``elections``, ``following``) use of their node: a
Protocol, so that they name it without importing ``RaftNode``."""
from __future__ import annotations

from typing import Any, Protocol

from snapshots.format import Snapshot


class NodeSide(Protocol):
    """What the replication rules use of their node (``quorum.raft.node.RaftNode``): its files, its
    recovery state (held back until it has caught up), its identity checks and its loop."""
    journal: Any
    store: Any
    identity: Any
    recovery: Any
    vouched: bool
    restricted: bool
    quiet: int
    votes_withheld: int
    last_compaction: float

    def on_loop_thread(self) -> bool: ...

    def propose_now(self) -> None: ...

    def wake(self) -> None: ...

    def quiet_append(self) -> None: ...

    def votes_without_pre_vote(self, address: str) -> bool: ...

    def check_recovery(self) -> None: ...

    def diverged(self, index: int, term: int, held: Any) -> None: ...

    def compact(self, prev: Any, last: Any, cluster: list[str]) -> None: ...

    def install(self, snap: Snapshot, data: bytes) -> None: ...

    def _apply(self, index: int, payload: bytes) -> Any: ...

    def _restore_state(self, records: list, last_index: int) -> None: ...
