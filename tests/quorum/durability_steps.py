"""Steps shared by the durability tests (test_durability*): what a cluster committed, and a node's journal
given a tail of term-1 entries."""
from __future__ import annotations

from tests.quorum.raft_messages import deliver


def _blocks_committed(c, count: int) -> int:
    """Register broker 1 and allocate it ``count`` blocks; returns its epoch."""
    epoch = c.register(1)
    for _ in range(count):
        c.allocate(1, epoch)
    return epoch


def _append_term_1_tail(node, leader, commit_index: int) -> None:
    """``leader`` appends entries 2 to 5 of term 1 after entry 1 to the node's log, with ``commit_index``."""
    deliver(node, leader, {"type": "append_entries", "term": 1, "commit_index": commit_index, "prevLogIdx": 1,
                            "prevLogTerm": 0, "entries": [(b"\x01", i, 1) for i in range(2, 6)]})
