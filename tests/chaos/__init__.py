"""Hand-made histories for the chaos history/checker/report tests.

``Hist`` builds a history op by op with explicit or auto-advancing times (1 ms a
step) and dense indexes, exactly as ``HistoryWriter`` would number them.
"""
from __future__ import annotations

from chaos.history import Op

MS = 1_000_000


class Hist:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0

    def op(self, process: str, type: str, f: str, value=None, *, t_ms: float | None = None,
           error: str | None = None) -> Op:
        self.t = int(t_ms * MS) if t_ms is not None else self.t + MS
        o = Op(process=process, type=type, f=f, value=value, time_ns=self.t, error=error, index=len(self.ops))
        self.ops.append(o)
        return o

    def invoke(self, process, f, value=None, **kw) -> Op:
        return self.op(process, "invoke", f, value, **kw)

    def allocate(self, process: str, broker_id: int, start: int, length: int, epoch: int = 1) -> Op:
        """An allocate that completes ok with [start, start + length); returns the ok op."""
        self.invoke(process, "allocate", {"broker_id": broker_id, "broker_epoch": epoch})
        return self.op(process, "ok", "allocate",
                       {"broker_id": broker_id, "broker_epoch": epoch, "start": start, "length": length})

    def generate(self, process: str, pid: int) -> Op:
        self.invoke(process, "generate")
        return self.op(process, "ok", "generate", pid)


def audit_block(raft_index: int, broker_id: int, start: int, length: int, epoch: int = 1) -> dict:
    return {"raft_index": raft_index, "broker_id": broker_id, "broker_epoch": epoch,
            "producer_id_start": start, "producer_id_len": length}


def final_state(next_id: int | dict, audit: list[dict], nodes=(1, 2, 3)) -> dict:
    nexts = next_id if isinstance(next_id, dict) else {n: next_id for n in nodes}
    return {"nodes": {str(n): {"next_producer_id": v, "commit_index": 10, "last_applied": 10}
                      for n, v in nexts.items()},
            "audit_blocks": audit}


def clean_run() -> tuple[Hist, dict]:
    """Two ProducerIdManagers, three blocks, a leader kill, every PID once: a valid run."""
    h = Hist()
    h.allocate("pidmgr-1", 1, 0, 10)
    h.allocate("pidmgr-2", 2, 10, 10)
    for pid in range(0, 5):
        h.generate("pidmgr-1", pid)
    h.invoke("nemesis", "kill-leader", {"node": 1})
    for pid in range(10, 13):
        h.generate("pidmgr-2", pid)
    h.op("nemesis", "ok", "kill-leader", {"node": 1})
    h.allocate("pidmgr-1", 1, 20, 10)
    h.generate("pidmgr-1", 20)
    audit = [audit_block(3, 1, 0, 10), audit_block(4, 2, 10, 10), audit_block(7, 1, 20, 10)]
    return h, final_state(30, audit)
