"""InitProducerId: producer IDs for idempotent producers, epochs for transactional ids."""
from __future__ import annotations

import logging
from typing import Any

from records.wire import kafka
from records.wire.errors import CoordinatorLoadInProgressError, Errors, InvalidRequestError, PidQuorumError

from .. import kafkaio as kio_
from ..api_keys import INIT_PRODUCER_ID
from ..pid_binding import PRINCIPAL, TRANSACTIONAL_ID
from .context import BrokerContext

# The front end logs under one name, whichever of its modules writes the line (log settings name it).
log = logging.getLogger("broker.frontend")


# ------------------------------------------------------------ InitProducerId
async def init_producer_id(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    server.counters["init_producer_id"] += 1
    expected_pid = int(getattr(b, "producer_id", -1))
    expected_epoch = int(getattr(b, "producer_epoch", -1))
    if (expected_pid == -1) != (expected_epoch == -1):
        raise InvalidRequestError("producer id and epoch must both be -1 or both be set")
    tid = b.transactional_id
    if server.pids is None:
        raise CoordinatorLoadInProgressError("the broker is starting")
    if tid is None:
        # Idempotent producer: a fresh ID from the block in hand, epoch 0, never waiting on the quorum.
        try:
            pid = server.pids.generate_producer_id()
        except CoordinatorLoadInProgressError:
            server.counters["load_in_progress"] += 1
            raise
        if server.bindings is not None:
            # On stable storage before the client learns the ID (group commit): it stays this principal's
            # across a restart, and nobody else may write with it (broker/pid_binding.py).
            await server.bindings.bind(pid, PRINCIPAL, req.principal)
        return _init_response(v, pid, 0)
    if tid == "":
        raise InvalidRequestError("transactional id must not be empty")
    timeout_ms = kio_.ms(b.transaction_timeout)
    try:
        pid, epoch = await _init_transactional(server, tid, timeout_ms, expected_pid, expected_epoch)
    except PidQuorumError as e:
        if e.code == Errors.PRODUCER_FENCED and v < 4:
            # PRODUCER_FENCED exists from InitProducerId v4 on; older clients know it by this name.
            log.info("InitProducerId v%d %r: %s (answered INVALID_PRODUCER_EPOCH)", v, tid, e.message)
            server._note_error(e.code)
            return _init_producer_id_refusal(v, Errors.INVALID_PRODUCER_EPOCH)
        raise
    if server.bindings is not None:
        await server.bindings.bind(pid, TRANSACTIONAL_ID, tid)
    return _init_response(v, pid, epoch)


async def _init_transactional(server: BrokerContext, tid: str, timeout_ms: int, pid: int, epoch: int) -> tuple[int, int]:
    """The quorum's epoch rules; an open transaction of the id is aborted (and a prepared one completed)
    first, by the coordinator (``TxnCoordinator.init_producer_id``)."""
    return await server.txn.init_producer_id(tid, timeout_ms, pid, epoch)


def _init_response(version: int, pid: int, epoch: int) -> Any:
    return kio_.response(INIT_PRODUCER_ID, version, {"throttle_time": 0, "error_code": 0, "producer_id": pid,
                                                     "producer_epoch": epoch})


# The body of ``api_table._init_producer_id_error``, for the refusal this handler answers itself.
def _init_producer_id_refusal(version: int, code: Errors) -> Any:
    return kio_.response(INIT_PRODUCER_ID, version, {"throttle_time": 0, "error_code": int(code),
                                                     "producer_id": -1, "producer_epoch": -1})
