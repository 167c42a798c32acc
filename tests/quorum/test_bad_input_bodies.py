"""Bad request bodies on the client port, against a real three-node quorum: malformed bodies, wrong
field types and absurd values, DescribeState bodies, unknown tagged fields, and lengths that would crash
the parser.  After each the node must still serve (``assert_serves``).  The module-scoped ``qcluster``
serves the module; the lengths test uses conftest's function-scoped ``cluster`` instead.
"""
from __future__ import annotations

import random
import socket
import struct
import uuid

import msgpack
import pytest

from quorum.client import api as p
from quorum.client.quorum import Connection
from tests.conftest import run
from records.wire import kafka
from records.wire.errors import Errors, InvalidRequestError, StaleBrokerEpochError
from tests.quorum.client_port_bytes import (
    IO_TIMEOUT,
    _broker_ids,
    alloc_body,
    assert_serves,
    corr_of,
    counters,
    framed,
    header_v1,
    header_v2,
    node_client,
    raw_conn,
    read_frame,
    read_until_closed,
    wait_counter,
)
from tests.quorum.client_port_bytes import _logs_on_failure  # noqa: F401 (an autouse fixture)


# ---------------------------------------------------------- 6. malformed body


def test_malformed_allocate_body_answers_42(qcluster):
    address = qcluster.lc.client_addresses()[1]
    rng = random.Random(0xBAD)
    garbage = rng.randbytes(3)
    before = counters(qcluster, address)["bad_requests"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x22446688) + garbage))
        corr, body = p.QUORUM_API.parse_response(read_frame(s), p.ALLOCATE_PRODUCER_IDS, 0)
        assert corr == 0x22446688, f"garbage {garbage!r}"
        assert int(body.error_code) == Errors.INVALID_REQUEST == 42, f"garbage {garbage!r}"
        assert int(body.producer_id_start) == -1 and int(body.producer_id_len) == 0
        # Empty body, and a body cut inside the epoch.
        for corr_id, bad in ((0x22446689, b""), (0x2244668A, alloc_body(1, 1)[:7])):
            s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, corr_id) + bad))
            corr, body = p.QUORUM_API.parse_response(read_frame(s), p.ALLOCATE_PRODUCER_IDS, 0)
            assert (corr, int(body.error_code)) == (corr_id, 42), bad
    assert wait_counter(qcluster, address, "bad_requests", before + 3) == before + 3
    assert_serves(qcluster, address)


@pytest.mark.parametrize("trailer", [b"\x00", b"xyz", bytes(64)], ids=["1", "3", "64"])
def test_trailing_bytes_after_valid_body_answers_42(qcluster, trailer):
    address = qcluster.lc.client_addresses()[2]
    apiv = (kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 0), 0x101)[4:], p.API_VERSIONS, 0)
    alloc = (header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x102) + alloc_body(1, 1), p.ALLOCATE_PRODUCER_IDS, 0)
    with raw_conn(address) as s:
        for payload, key, version in (apiv, alloc):
            corr = corr_of(payload[4:])
            s.sendall(framed(payload + trailer))
            got_corr, body = p.QUORUM_API.parse_response(read_frame(s), key, version)
            assert got_corr == corr
            assert int(body.error_code) == Errors.INVALID_REQUEST, (key, trailer)
    assert_serves(qcluster, address)


# ------------------------------------------- 7. wrong field types, absurd values


def test_allocate_with_absurd_ids_and_epochs(qcluster):
    address = qcluster.lc.client_addresses()[0]

    async def go():
        async with node_client(address) as c:
            with pytest.raises(InvalidRequestError) as e:
                await c.allocate(-5, 1)
            assert e.value.code == Errors.INVALID_REQUEST == 42
            with pytest.raises(InvalidRequestError):
                await c.allocate(-(2**31), 1)
            with pytest.raises(StaleBrokerEpochError) as e:
                await c.allocate(2**31 - 1, 1)  # valid id, never registered
            assert e.value.code == Errors.STALE_BROKER_EPOCH == 77
            broker_id = next(_broker_ids)
            epoch = await c.register_broker(broker_id)
            for bad_epoch in (-1, 0, epoch + 1, 2**63 - 1, -(2**63)):
                with pytest.raises(StaleBrokerEpochError) as e:
                    await c.allocate(broker_id, bad_epoch)
                assert e.value.code == 77, bad_epoch
            block = await c.allocate(broker_id, epoch)  # the right epoch still works
            assert block.length > 0

    run(go())
    assert_serves(qcluster, address)


def test_registration_and_heartbeat_bad_values(qcluster):
    address = qcluster.lc.client_addresses()[1]

    async def go():
        async with node_client(address) as c:
            for bad_id in (-1, -(2**31)):
                with pytest.raises(InvalidRequestError) as e:
                    await c.register_broker(bad_id)
                assert e.value.code == 42
            # A null (all-zero) incarnation id is refused.
            conn = Connection(address)
            try:
                body = await conn.call(kafka.request_entity(p.BROKER_REGISTRATION, 0, broker_id=p.i32(next(_broker_ids)),
                                                        cluster_id="x", incarnation_id=None, listeners=(),
                                                        features=(), rack=None), IO_TIMEOUT)
            finally:
                conn.close()
            assert int(body.error_code) == 42
            # Stale epoch: the broker re-registered with a new incarnation.
            broker_id = next(_broker_ids)
            old = await c.register_broker(broker_id, uuid.uuid4())
            new = await c.register_broker(broker_id, uuid.uuid4())
            assert new > old
            with pytest.raises(StaleBrokerEpochError) as e:
                await c.heartbeat(broker_id, old)
            assert e.value.code == 77
            with pytest.raises(StaleBrokerEpochError):
                await c.heartbeat(next(_broker_ids), 1)  # never registered
            with pytest.raises(InvalidRequestError):
                await c.heartbeat(-1, new)
            with pytest.raises(StaleBrokerEpochError):
                await c.allocate(broker_id, old)
            assert (await c.heartbeat(broker_id, new))["should_shut_down"] is False

    run(go())
    assert_serves(qcluster, address)


def test_registration_with_invalid_utf8_cluster_id_answers_42(qcluster):
    address = qcluster.lc.client_addresses()[2]
    # BrokerRegistration v0 body: broker id, compact string cluster id (len+1 varint), uuid,
    # empty compact arrays (listeners, features), null compact string rack, no tagged fields.
    body = struct.pack(">i", next(_broker_ids)) + b"\x03\xff\xfe" + uuid.uuid4().bytes + b"\x01\x01\x00\x00"
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.BROKER_REGISTRATION, 0, 0x5150) + body))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.BROKER_REGISTRATION, 0)
    assert corr == 0x5150
    assert int(resp.error_code) == 42 and int(resp.broker_epoch) == -1
    assert_serves(qcluster, address)


# ---------------------------------------------- 9. DescribeState bad bodies


@pytest.mark.parametrize("body", [
    msgpack.packb([1, 2]), msgpack.packb(7), msgpack.packb("state"), msgpack.packb(None),
    msgpack.packb(True), msgpack.packb(b"\x00\x01", use_bin_type=True), b"", b"\x82\xa1",
    msgpack.packb({}) + b"\x01", b"\xc1", msgpack.packb({1: 2}),
], ids=["list", "int", "str", "nil", "bool", "bin", "empty", "truncated", "extra", "reserved-c1", "int-key"])
def test_describe_state_non_map_body_answers_42(qcluster, body):
    address = qcluster.lc.client_addresses()[1]
    before = counters(qcluster, address)["bad_requests"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 0, 0x7E57) + body))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E57
        assert resp["error_code"] == Errors.INVALID_REQUEST and set(resp) == {"error_code", "error_message"}
        assert resp["error_message"].startswith("malformed DescribeState body"), resp
        # Same connection, a well-formed DescribeState is answered in full.
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 0, 0x7E58) + msgpack.packb({})))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E58 and resp["error_code"] == 0 and "raft" in resp
    assert wait_counter(qcluster, address, "bad_requests", before + 1) == before + 1
    assert_serves(qcluster, address)


@pytest.mark.parametrize("tail", [b"", b"\x00", b"\x00\x64abc", b"\xff\xfe", b"\x00\x02\xff\xfe"],
                         ids=["no-client-id", "cut-length", "cut-client-id", "negative-length", "invalid-utf8"])
def test_describe_state_unreadable_header_answers_42(qcluster, tail):
    """As for the Kafka APIs, an unreadable header after a readable key, version and
    correlation id is answered INVALID_REQUEST, and the connection stays open."""
    address = qcluster.lc.client_addresses()[0]
    before = counters(qcluster, address)["bad_requests"]
    with raw_conn(address) as s:
        s.sendall(framed(struct.pack(">hhi", p.ADMIN_API_KEY, 0, 0x7E5A) + tail))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E5A
        assert resp["error_code"] == Errors.INVALID_REQUEST and "header" in resp["error_message"], resp
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 0, 0x7E5B) + msgpack.packb({})))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
        assert corr == 0x7E5B and resp["error_code"] == 0 and "raft" in resp
    assert wait_counter(qcluster, address, "bad_requests", before + 1) == before + 1
    assert_serves(qcluster, address)


def test_describe_state_unsupported_version_answers_35(qcluster):
    address = qcluster.lc.client_addresses()[2]
    with raw_conn(address) as s:
        s.sendall(framed(header_v1(p.ADMIN_API_KEY, 1, 0x7E59) + msgpack.packb({})))
        corr, resp = p.QUORUM_API.parse_response(read_frame(s), p.ADMIN_API_KEY, 0)
    assert corr == 0x7E59 and resp["error_code"] == Errors.UNSUPPORTED_VERSION
    assert "not supported" in resp["error_message"], resp
    assert_serves(qcluster, address)


# ------------------------------------------------------ unknown tagged fields


@pytest.mark.parametrize("where", ["body", "header"])
def test_unknown_tagged_field_is_answered(qcluster, where):
    """Kafka skips unknown tagged fields; at worst the request is INVALID_REQUEST.  (Regression:
    kio raises KeyError for them, which parse_request once let escape, killing the connection
    handler and closing the connection unanswered.)"""
    address = qcluster.lc.client_addresses()[1]
    broker_id = next(_broker_ids)  # never registered: a tolerant server answers 77, a strict one 42
    tag = b"\x01\x05\x02ab"  # one tagged field: tag 5, 2 bytes
    if where == "body":
        payload = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x7A7) + struct.pack(">iq", broker_id, 1) + tag
    else:
        payload = header_v1(p.ALLOCATE_PRODUCER_IDS, 0, 0x7A7) + tag + alloc_body(broker_id, 1)
    with raw_conn(address) as s:
        s.sendall(framed(payload))
        s.shutdown(socket.SHUT_WR)
        data = read_until_closed(s, timeout=15)
    assert data, "the server closed the connection without answering"
    size = struct.unpack_from(">i", data)[0]
    assert len(data) == 4 + size, f"expected exactly one response, got {data!r}"
    corr, body = p.QUORUM_API.parse_response(data[4:], p.ALLOCATE_PRODUCER_IDS, 0)
    assert corr == 0x7A7
    assert int(body.error_code) in (Errors.INVALID_REQUEST, Errors.STALE_BROKER_EPOCH)
    assert_serves(qcluster, address)


# ------------------------------------------- lengths that would crash kio
#
# kio's native reader sizes an array from its wire length before reading any
# element; a 40-byte frame claiming 2**32 - 2 listeners made it allocate
# 32 GiB and abort the node.  records/wire/bounds.py bounds every length first.


@pytest.mark.parametrize("version", [0, 4])
def test_huge_array_length_does_not_kill_node(cluster, version):
    """A 40-byte BrokerRegistration whose listeners compact-array length is the varint
    ff ff ff ff 0f (2^32 - 2 entries): INVALID_REQUEST, and the node keeps serving.
    Own cluster: before the fix this killed the node."""
    address = cluster.lc.client_addresses()[0]
    cluster.leader(timeout=20)
    body = struct.pack(">i", 1) + b"\x01" + uuid.uuid4().bytes + bytes.fromhex("ffffffff0f")
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.BROKER_REGISTRATION, version, 0x0BAD) + body))
        s.shutdown(socket.SHUT_WR)
        data = read_until_closed(s, timeout=15)
    assert data, "no answer: the node closed the connection or died"
    size = struct.unpack_from(">i", data)[0]
    corr, resp = p.QUORUM_API.parse_response(data[4:4 + size], p.BROKER_REGISTRATION, version)
    assert corr == 0x0BAD and int(resp.error_code) == Errors.INVALID_REQUEST
    assert_serves(cluster, address)
