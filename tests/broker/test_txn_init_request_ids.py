"""Each InitProducerId call of a coordinator names itself with its own request id, even while another call
of the same coordinator is under way (found by the transaction simulation, seed 500000: two instances of one
transactional id, on one broker, sent the same request id; the quorum answered the second, a new instance,
with the first's epoch, so neither fenced the other)."""
from __future__ import annotations

import asyncio

from broker.txn_coordinator import TxnCoordinator


class SlowQuorum:
    """Answers InitProducerId after other tasks ran (a round trip), keeping each request id sent."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.epoch = 0

    async def init_transactional_sequence(self, broker_id, broker_epoch, tid, timeout_ms, pid=-1, epoch=-1,
                                          request_id=""):
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.request_ids.append(request_id)
        self.epoch += 1
        return 7, self.epoch, -1


class NoStorage:
    def topic(self, name):
        return None


def test_concurrent_init_producer_id_calls_send_distinct_request_ids():
    q = SlowQuorum()

    async def run_io(fn, *args):
        return fn(*args)

    async def reregister():
        raise AssertionError("not expected")

    async def go():
        c = TxnCoordinator(1, q, NoStorage(), run_io, lambda: 5, reregister)
        return await asyncio.gather(c.init_producer_id("tx", 60_000, -1, -1), c.init_producer_id("tx", 60_000, 7, 0))
    answers = asyncio.run(go())
    assert len(set(q.request_ids)) == 2, q.request_ids
    assert sorted(q.request_ids) == ["1:5:1", "1:5:2"]
    assert sorted(answers) == [(7, 1), (7, 2)]
