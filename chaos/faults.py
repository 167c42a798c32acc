"""The faults a chaos run or a test arms at a failpoint (``failpoints``), by name.

A spec is ``POINT=ACTION[:ARG]``:

* ``quorum.allocate=reissue-latest-once``: a deliberately broken allocator, to prove the
  checkers catch a double issue.  The first AllocateProducerIds this process serves as
  leader is answered with the latest committed block again (nothing is committed for it),
  as a leader that trusted a stale copy of its cursor after a restart would.
* ``broker.produce.appended=drop-every:N``: every Nth produce request is appended and
  its connection then closed instead of answered, so clients retry batches the log
  holds (the idempotence tests).
* ``broker.txn.prepared=crash``: the broker process ends at once (``os._exit``, no
  cleanup, like kill -9) the first time a transaction is decided and none of its
  markers is written yet; the restarted broker must complete it.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from quorum import failpoints

log = logging.getLogger(__name__)


def _reissue_latest_once(arg: str | None) -> Callable[..., Any]:
    done = []

    def action(service) -> tuple[int, int] | None:
        if done:
            return None
        done.append(True)
        with service.lock:
            latest = service.state.producer_ids.latest
        if latest is None:
            return None
        log.critical("UNSAFE broken allocator (for tests only): re-issuing block [%d, +%d) without committing it",
                     latest.producer_id_start, latest.producer_id_len)
        return (latest.producer_id_start, latest.producer_id_len)
    return action


def _drop_every(arg: str | None) -> Callable[..., Any]:
    try:
        every = int(arg or "")
    except ValueError:
        raise ValueError(f"drop-every needs a count (drop-every:N), got {arg!r}") from None
    if every < 1:
        raise ValueError(f"drop-every:N needs N >= 1, got {every}")

    def action(produce_requests: int) -> bool:
        return produce_requests % every == 0
    return action


def _crash(arg: str | None) -> Callable[..., Any]:
    def action(transactional_id: str, state: str) -> None:
        log.critical("failpoint: crashing with the transaction of %r %s and no marker written", transactional_id,
                     state)
        logging.shutdown()
        os._exit(CRASH_EXIT)
    return action


CRASH_EXIT = 137  # what a kill -9 leaves

ACTIONS: dict[tuple[str, str], Callable[[str | None], Callable[..., Any]]] = {
    ("quorum.allocate", "reissue-latest-once"): _reissue_latest_once,
    ("broker.produce.appended", "drop-every"): _drop_every,
    ("broker.txn.prepared", "crash"): _crash,
}


def arm_spec(spec: str) -> None:
    """Arm ``POINT=ACTION[:ARG]`` in this process (ValueError naming what is known if it is not)."""
    point, sep, what = spec.partition("=")
    name, _, arg = what.partition(":")
    make = ACTIONS.get((point, name)) if sep else None
    if make is None:
        known = ", ".join(f"{p}={a}" for p, a in sorted(ACTIONS))
        raise ValueError(f"unknown fault {spec!r} (known: {known})")
    failpoints.arm(point, make(arg or None))


def add_option(parser) -> None:
    """``--failpoint POINT=ACTION[:ARG]`` (repeatable) on a launcher's argparse parser."""
    parser.add_argument("--failpoint", action="append", default=[], metavar="POINT=ACTION[:ARG]",
                        help="arm a failpoint (chaos.faults)")


def arm_or_explain(specs: list[str], prog: str) -> bool:
    """Arm every spec; on a bad one say why on stderr (as ``prog``) and return False."""
    try:
        for spec in specs:
            arm_spec(spec)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return False
    return True


BROKEN_ALLOCATOR = "quorum.allocate=reissue-latest-once"
