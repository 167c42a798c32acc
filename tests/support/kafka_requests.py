"""Kafka requests built and sent by hand, for tests that speak to a broker below a client library."""
from __future__ import annotations

import asyncio

from kio.index import load_request_schema

from broker.recordbatch import encode_batch
from quorum.client.quorum import Connection


def entity(api_key: int, version: int, cls_name: str, **fields):
    """An instance of ``cls_name``, a nested entity of the request schema of ``api_key`` at ``version``."""
    mod = __import__(load_request_schema(api_key, version).__module__, fromlist=[cls_name])
    return getattr(mod, cls_name)(**fields)


def batch(pid=-1, epoch=-1, seq=-1, n=1, value=b"v"):
    """One record batch of ``n`` records (``value`` + index), of producer ``pid`` at ``epoch`` from ``seq``."""
    return encode_batch([(None, value + str(i).encode()) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq)


def request_once(bootstrap: str, client_id: str, body, security=None):
    """The response to ``body`` on a connection of its own to ``bootstrap``, waiting up to 10 s."""
    async def go():
        conn = Connection(bootstrap, client_id, security)
        try:
            return await conn.call(body, 10.0)
        finally:
            conn.close()
    return asyncio.run(go())
