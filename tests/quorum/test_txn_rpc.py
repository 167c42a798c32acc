"""InitTransactionalProducer over the wire, on a real three-node cluster.

The transaction coordinator's state lives in the quorum: two brokers (and any
node, leader or follower) see the same epochs, a kill of the leader loses no
bump, and bad payloads get INVALID_REQUEST while the node keeps serving.
"""
from __future__ import annotations

import socket
import struct

import msgpack
import pytest

from quorum.client import api as p
from quorum.client.quorum import QuorumClient, RetryPolicy
from tests.conftest import run
from records.wire.errors import (
    Errors,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    ProducerFencedError,
    StaleBrokerEpochError,
)


def one_node_client(address: str) -> QuorumClient:
    return QuorumClient([address], RetryPolicy(timeout=10.0), client_id="txn-test")


def test_epochs_are_shared_by_brokers_and_nodes_and_survive_leader_kill(cluster):
    async def go():
        addrs = cluster.lc.client_addresses()
        via = [one_node_client(a) for a in addrs]  # one client per node: followers forward
        try:
            e1 = await via[0].register_broker(1)
            e2 = await via[1].register_broker(2)
            pid, epoch = await via[0].init_transactional(1, e1, "orders", 60_000)
            assert epoch == 0
            # A second instance through broker 2 and another node: same pid, epoch bumped.
            assert await via[1].init_transactional(2, e2, "orders", 60_000) == (pid, 1)
            # The first instance asking with its old epoch is fenced, on any node.
            for c in via:
                with pytest.raises(ProducerFencedError, match="not the current producer"):
                    await c.init_transactional(1, e1, "orders", 60_000, pid, 0)
            # The current instance bumps; the retry of that bump gets the same answer.
            assert await via[2].init_transactional(2, e2, "orders", 60_000, pid, 1) == (pid, 2)
            assert await via[0].init_transactional(1, e1, "orders", 60_000, pid, 1) == (pid, 2)
            return pid, e1
        finally:
            for c in via:
                await c.close()
    pid, e1 = run(go())

    leader = cluster.leader()
    cluster.lc.kill(leader)

    async def after():
        c = QuorumClient(cluster.lc.client_addresses(), RetryPolicy(timeout=15.0), client_id="txn-after")
        try:
            assert await c.init_transactional(1, e1, "orders", 60_000, pid, 2) == (pid, 3)
            # A new transactional id gets a producer id from the same cursor as blocks:
            block = await c.allocate(1, e1)
            other, _ = await c.init_transactional(1, e1, "payments", 60_000)
            assert other >= block.next_id or other < block.start
            assert other != pid
        finally:
            await c.close()
    run(after())


def test_errors_come_back_typed(cluster):
    async def go():
        c = cluster.client()
        try:
            e = await c.register_broker(4)
            with pytest.raises(InvalidTransactionTimeoutError):
                await c.init_transactional(4, e, "t", 0)
            with pytest.raises(InvalidRequestError, match="both"):
                await c.init_transactional(4, e, "t", 1000, -1, 3)
            with pytest.raises(InvalidRequestError):
                await c.init_transactional(4, e, "", 1000)
            with pytest.raises(StaleBrokerEpochError):
                await c.init_transactional(4, e + 100, "t", 1000)
            assert (await c.init_transactional(4, e, "t", 1000))[1] == 0
        finally:
            await c.close()
    run(go())


def _raw_call(address: str, api_key: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, 99, 4) + b"test"
    frame = header + body
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv(s, 4))[0]
        return _recv(s, size)


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


@pytest.mark.parametrize("body", [
    b"\xc1",                                             # not msgpack
    msgpack.packb({"transactional_id": "t"}),            # a map, not the record
    msgpack.packb([103, 0, [0, None, -1, -1]]),          # the response record, not the request
    msgpack.packb([102, 0, [1, 2]]),                     # missing fields
    msgpack.packb([102, 0, [1, 2, 7, 1000, -1, -1]]),    # wrong type (int transactional id)
    msgpack.packb([102, 0, [1, 2, "t", 1000, -1, 2**15]]),  # epoch out of int16
])
def test_malformed_payloads_are_invalid_request_and_node_keeps_serving(cluster, body):
    address = cluster.lc.client_addresses()[0]
    data = _raw_call(address, p.TXN_API_KEY, 0, body)
    corr, resp = p.QUORUM_API.parse_response(data, p.TXN_API_KEY, 0)
    assert corr == 99
    assert resp.error_code == Errors.INVALID_REQUEST
    assert "pidquorum RPC" in resp.error_message
    data = _raw_call(address, p.TXN_API_KEY, 1, msgpack.packb([102, 0, [1, 2, "t", 1000, -1, -1]]))
    assert p.QUORUM_API.parse_response(data, p.TXN_API_KEY, 0)[1].error_code == Errors.UNSUPPORTED_VERSION

    async def still_serves():
        c = cluster.client()
        try:
            e = await c.register_broker(9)
            return await c.init_transactional(9, e, "after-bad-input", 1000)
        finally:
            await c.close()
    assert run(still_serves())[1] == 0


def test_describe_transactional_reads_the_current_epoch_through_the_leader(cluster):
    async def go():
        addrs = cluster.lc.client_addresses()
        via = [one_node_client(a) for a in addrs]
        try:
            e = await via[0].register_broker(1)
            assert await via[1].describe_transactional("nobody") == (-1, -1)
            pid, _ = await via[0].init_transactional(1, e, "reader", 60_000)
            await via[0].init_transactional(1, e, "reader", 60_000)
            # Every node, followers included, answers with the bump just acknowledged.
            for c in via:
                assert await c.describe_transactional("reader") == (pid, 1)
        finally:
            for c in via:
                await c.close()
    run(go())
