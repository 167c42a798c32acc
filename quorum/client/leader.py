"""Which node leads, from the nodes' DescribeState answers (``QuorumClient.find_leader`` polls them)."""
from __future__ import annotations

from typing import Any, Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)


def pick_leader(answers: Mapping[K, Mapping[str, Any] | None]) -> K | None:
    """The key of the leader among DescribeState ``answers`` (by any key: client address, node id; None
    values: no answer), or None when the answers name none that can be trusted:

    * only a node that says it leads is a candidate, and of several the one with the highest term (a
      deposed leader that has not noticed, e.g. one that was paused, still says "leader" in its old term);
    * two that say they lead in that term: no answer (Raft never elects two in one term);
    * an answer that names another leader in the same term or a later one contradicts it: no answer (the
      candidate was deposed and the new leader did not answer).

    A node in a later term that knows no leader does not count against it: a node of an earlier version cut
    off from the others campaigns over and over, its term running ahead while the majority's leader goes on,
    and a node held back after a restore never campaigns.
    """
    raft = {k: d["raft"] for k, d in answers.items() if d is not None and d.get("raft") is not None}
    claims = [(r["term"], k) for k, r in raft.items() if r["state"] == "leader"]
    if not claims:
        return None
    term = max(t for t, _ in claims)
    top = [k for t, k in claims if t == term]
    if len(top) != 1:
        return None
    key = top[0]
    me = raft[key]["self"]
    for k, r in raft.items():
        if k == key or r["leader"] is None or r["leader"] == me:
            continue
        if r["term"] >= term:
            return None  # follows another leader in this term or a later one
    return key


def summary(answer: Mapping[str, Any] | BaseException) -> str:
    """One node in a "no leader among ..." message: its Raft state (and term if it leads), or its error."""
    if isinstance(answer, BaseException):
        return type(answer).__name__
    r = answer["raft"]
    return f"{r['state']} (term {r['term']})" if r["state"] == "leader" else str(r["state"])


__all__ = ["pick_leader", "summary"]
