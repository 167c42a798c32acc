"""Failpoints: the one seam through which a test or a chaos run injects a fault into production code.

Production code names a point and calls ``hit(name, *args)`` there.  Nothing happens
(``hit`` returns None) unless a test, or a chaos launcher for a child process
(``python -m chaos.armed``, ``python -m chaos.faultnode --failpoint``), armed that point
in this process with ``arm``: no environment variable, file or flag of a production
command arms one.  What a point does when armed is the arming code's business; the
point only says what it passes and what an answer means (``POINTS``).

Storage faults go through the other seam production code offers, the ``Disk`` it is
given (``snapshots.storage.disk``): the simulator and ``chaos.faultnode`` pass their own.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

POINTS: dict[str, str] = {
    "quorum.allocate": "Proposer.submit, before an AllocateProducerIds is served (leader): called with the Service; "
                       "a (start, length) is answered instead, without committing anything; None goes on",
    "broker.produce.appended": "BrokerServer, after a Produce request appended batches: called with the count of "
                               "produce requests so far; True closes the connection instead of answering",
    "broker.txn.prepared": "TxnCoordinator.complete, once a transaction's outcome is decided in the quorum and "
                           "before any of its markers is written: called with the transactional id and the "
                           "state; the action may end the process there (a crash between EndTxn and the markers)",
}

_armed: dict[str, Callable[..., Any]] = {}


def hit(name: str, *args: Any) -> Any:
    """What the armed action answers at ``name`` (None when nothing is armed there)."""
    action = _armed.get(name)
    return None if action is None else action(*args)


def arm(name: str, action: Callable[..., Any]) -> None:
    if name not in POINTS:
        raise ValueError(f"no failpoint {name!r} (known: {', '.join(sorted(POINTS))})")
    _armed[name] = action
    log.warning("failpoint %s armed: this process injects faults (for tests only)", name)


def disarm(name: str) -> None:
    _armed.pop(name, None)


@contextlib.contextmanager
def armed(name: str, action: Callable[..., Any]) -> Iterator[None]:
    """``with armed(name, action):`` the point is armed inside the block only."""
    arm(name, action)
    try:
        yield
    finally:
        disarm(name)


__all__ = ["POINTS", "arm", "armed", "disarm", "hit"]
