"""Bad input inside forwarded requests (Envelope, KIP-590), against a real three-node quorum."""
from __future__ import annotations

import struct

import pytest
from kio.schema.envelope.v0.request import EnvelopeRequest

from quorum.client import api as p
from tests.conftest import ClusterHarness, run
from records.wire import kafka
from records.wire.errors import Errors
from tests.quorum.client_port_bytes import (
    alloc_body,
    assert_serves,
    counters,
    follower_address,
    framed,
    header_v2,
    raw_conn,
    read_frame,
    register_new_broker,
)
from tests.quorum.client_port_bytes import _logs_on_failure  # noqa: F401 (an autouse fixture)


# ------------------------------------------------- forwarding (Envelope, KIP-590)
#
# A follower forwards a client's frame as it arrived to the leader inside an Envelope and relays
# the leader's answer frame as it is.  Envelope is parsed by every node but not advertised; without
# SASL any client can send one, so everything inside it is bad input like any other.


def _envelope(inner: bytes, principal: bytes | None = b"User:ANONYMOUS", host: bytes = b"\x7f\x00\x00\x01"):
    return EnvelopeRequest(request_data=inner, request_principal=principal, client_host_address=host)


def _send_envelope(address: str, envelope: EnvelopeRequest, corr: int = 0x0E0E) -> tuple[int, Errors, bytes | None]:
    with raw_conn(address) as s:
        s.sendall(kafka.encode_request(envelope, corr, "envelope-test"))
        got, resp = kafka.parse_response(read_frame(s), p.ENVELOPE, 0)
    return got, Errors.of(int(resp.error_code)), None if resp.response_data is None else bytes(resp.response_data)


def _leader_address(h: ClusterHarness) -> str:
    leader = h.leader()
    return next(n.client_address for n in h.lc.nodes() if n.node_id == leader)


def test_a_follower_forwards_the_clients_frame_and_relays_the_leaders_answer(qcluster):
    """AllocateProducerIds sent to a follower: the answer carries the client's own correlation id
    and a block, the follower counted one forward, and the leader answered it in an Envelope."""
    address = follower_address(qcluster)
    leader = _leader_address(qcluster)

    broker_id, epoch = run(register_new_broker(leader))
    before = counters(qcluster, address)["forwarded"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x5EED, b"odd \xc3\xa9 client")
                         + alloc_body(broker_id, epoch)))
        corr, body = p.QUORUM_API.parse_response(read_frame(s, timeout=20), p.ALLOCATE_PRODUCER_IDS, 0)
    assert corr == 0x5EED and int(body.error_code) == 0 and int(body.producer_id_len) > 0, body
    assert counters(qcluster, address)["forwarded"] >= before + 1


def test_the_leader_answers_an_envelope_with_the_inner_answer_frame(qcluster):
    address = _leader_address(qcluster)
    inner = kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 3, client_software_name="t",
                                                      client_software_version="1"), 0x1234, "inner")[4:]
    corr, code, data = _send_envelope(address, _envelope(inner))
    assert corr == 0x0E0E and code == Errors.NONE
    inner_corr, body = p.QUORUM_API.parse_response(data, p.API_VERSIONS, 3)
    assert inner_corr == 0x1234 and int(body.error_code) == 0
    assert {int(k.api_key) for k in body.api_keys} == set(p.SUPPORTED)  # Envelope is not advertised


@pytest.mark.parametrize("inner, code", [
    (b"", Errors.INVALID_REQUEST),
    (b"\x00\x43", Errors.INVALID_REQUEST),  # truncated header
    (struct.pack(">hhi", 0x7FFF, 0, 1) + b"\x00\x00", Errors.INVALID_REQUEST),  # unknown API key
    (None, Errors.INVALID_REQUEST),  # an Envelope inside an Envelope
], ids=["empty", "truncated", "unknown-key", "nested"])
def test_a_bad_envelope_is_refused_and_the_node_serves_on(qcluster, inner, code):
    address = _leader_address(qcluster)
    if inner is None:
        inner = kafka.encode_request(_envelope(b"\x00"), 7, "nested")[4:]
    corr, got, data = _send_envelope(address, _envelope(inner))
    assert corr == 0x0E0E and got == code and data is None
    assert_serves(qcluster, address)


def test_an_unsupported_version_in_an_envelope_is_unsupported_version(qcluster):
    """Inside a well-formed envelope, a request at a version the leader does not serve answers the
    Envelope UNSUPPORTED_VERSION (as Kafka's EnvelopeUtils does), told apart from a malformed Envelope."""
    address = _leader_address(qcluster)
    inner = header_v2(p.ALLOCATE_PRODUCER_IDS, 9, 0x4321) + alloc_body(1, 1)
    corr, code, data = _send_envelope(address, _envelope(inner, principal=None, host=b"junk"))
    assert corr == 0x0E0E and code == Errors.UNSUPPORTED_VERSION and data is None
    assert_serves(qcluster, address)


def test_a_bad_body_in_an_envelope_gets_its_own_error_answer(qcluster):
    """Inside the envelope, a request with a readable header and a bad body is answered as a client
    would be answered (INVALID_REQUEST), in the raw answer the follower would relay."""
    address = _leader_address(qcluster)
    inner = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x4321) + b"\x01"
    corr, code, data = _send_envelope(address, _envelope(inner, principal=None, host=b"junk"))
    assert code == Errors.NONE
    inner_corr, body = p.QUORUM_API.parse_response(data, p.ALLOCATE_PRODUCER_IDS, 0)
    assert inner_corr == 0x4321 and int(body.error_code) == Errors.INVALID_REQUEST
    assert_serves(qcluster, address)


def test_a_follower_does_not_forward_a_forwarded_request_again(qcluster):
    """An Envelope reaching a node that is not the leader is answered NOT_CONTROLLER (the forwarding
    node then tries the new leader), never forwarded a second time."""
    address = follower_address(qcluster)
    before = counters(qcluster, address)["forwarded"]
    inner = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 0x4322) + alloc_body(1, 1)
    corr, code, data = _send_envelope(address, _envelope(inner))
    assert code == Errors.NOT_CONTROLLER and data is None
    assert counters(qcluster, address)["forwarded"] == before
