"""Steps and fixtures shared by the managers' tests (test_managers*): register, allocate and heartbeat
through generate then replay, a state's fingerprint, the check that a replay was refused, an empty state and one with broker 1 registered.
``state`` here is empty, unlike conftest's; the modules that import it use this one."""
from __future__ import annotations

import pytest

from quorum.managers import DEFAULT_BLOCK_SIZE, QuorumState
from records import AllocateProducerIdsRecord
from records.wire.errors import InvariantViolation


NOW = 1_700_000_000_000


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def fingerprint(state: QuorumState):
    """Everything observable about a state (snapshot records compare by value)."""
    return state.snapshot_records(), state.summary(), state.producer_ids.latest


def register(state: QuorumState, broker_id: int, incarnation: str = None, listener: str = "h:1") -> int:
    incarnation = incarnation or f"inc-{broker_id}"
    res = state.registrations.generate_register(broker_id, incarnation, listener, NOW)
    for rec in res.records:
        state.replay(rec)
    return res.response


def allocate(state: QuorumState, broker_id: int, epoch: int, block_size: int = DEFAULT_BLOCK_SIZE,
             now_ms: int = NOW) -> tuple[int, int]:
    res = state.producer_ids.generate_allocate(broker_id, epoch, state.registrations, block_size, now_ms)
    assert len(res.records) == 1
    state.replay(res.records[0])
    return res.response


def heartbeat(state: QuorumState, broker_id: int, epoch: int, fence: bool = False, shut_down: bool = False):
    res = state.registrations.generate_heartbeat(broker_id, epoch, fence, shut_down, NOW)
    for rec in res.records:
        state.replay(rec)
    return res


def block(start: int, length: int = 10, broker_id: int = 1, epoch: int = 1) -> AllocateProducerIdsRecord:
    return AllocateProducerIdsRecord(broker_id=broker_id, broker_epoch=epoch, producer_id_start=start,
                                     producer_id_len=length, timestamp_ms=NOW)


@pytest.fixture
def state() -> QuorumState:
    return QuorumState()


@pytest.fixture
def registered(state):
    """A state with broker 1 registered (epoch 1)."""
    epoch = register(state, 1)
    assert epoch == 1
    return state


def _refused(state: QuorumState, rec, fragment: str):
    before = fingerprint(state)
    with pytest.raises(InvariantViolation) as ei:
        state.replay(rec)
    assert fragment in str(ei.value)
    assert fingerprint(state) == before
