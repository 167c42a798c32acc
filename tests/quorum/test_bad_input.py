"""Bad input on the client port, against a real three-node quorum: the framing (size prefix, truncated
frames and headers, unknown API keys, unsupported versions), garbage connections and pipelining.

Hand-built bytes go over raw sockets to one node's client port; after every bad input the same node must
still serve a normal client (``assert_serves``).  One module-scoped cluster (conftest's ``qcluster``)
serves the module.  Bad bodies are in test_bad_input_bodies, forwarded frames in test_bad_input_forwarding.
"""
from __future__ import annotations

import os
import random
import socket
import struct

import pytest

from quorum.client import api as p
from tests.conftest import run, wait_for
from records.wire import kafka
from records.wire.errors import Errors
from tests.quorum.client_port_bytes import (
    MAX_FRAME,
    alloc_body,
    apiversions_v3_frame,
    assert_serves,
    corr_of,
    counters,
    expect_closed,
    follower_address,
    framed,
    header_v2,
    node_pid,
    open_fds,
    raw_conn,
    read_frame,
    read_until_closed,
    register_new_broker,
    wait_counter,
)
from tests.quorum.client_port_bytes import _logs_on_failure  # noqa: F401 (an autouse fixture)
from tests.quorum.client_port_bytes import header_v1  # noqa: F401 (other test modules import it from here)


# ------------------------------------------------------ 1. frame size prefix


@pytest.mark.parametrize("size", [0, -1, -(2**31), 2 * 1024 * 1024, MAX_FRAME + 1, 2**31 - 1],
                         ids=["zero", "minus-one", "int32-min", "2MiB", "max-plus-one", "int32-max"])
def test_bad_frame_size_closes_connection(qcluster, size):
    address = qcluster.lc.client_addresses()[0]
    before = counters(qcluster, address)["bad_frames"]
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", size))
        expect_closed(s)
    assert wait_counter(qcluster, address, "bad_frames", before + 1) == before + 1
    assert_serves(qcluster, address)


def test_frame_of_exactly_max_size_is_served(qcluster):
    """The cap is inclusive: a valid request of exactly max_frame_bytes is answered."""
    address = qcluster.lc.client_addresses()[1]
    data = apiversions_v3_frame(4242, MAX_FRAME)
    assert struct.unpack(">i", data[:4])[0] == MAX_FRAME
    with raw_conn(address) as s:
        s.sendall(data)
        frame = read_frame(s)
    corr, body = p.QUORUM_API.parse_response(frame, p.API_VERSIONS, 3)
    assert corr == 4242 and int(body.error_code) == 0
    assert_serves(qcluster, address)


# --------------------------------------------------------- 2. truncated frame


def test_truncated_frame_then_close(qcluster):
    address = qcluster.lc.client_addresses()[0]
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", 100) + os.urandom(10))
    assert_serves(qcluster, address)
    # Half-close instead: the server sees end of input mid-frame and closes its side.
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", 100) + os.urandom(10))
        s.shutdown(socket.SHUT_WR)
        expect_closed(s)
    assert_serves(qcluster, address)


def test_truncated_frame_log_reports_bytes_received(qcluster):
    """The log line names how much of the frame arrived (it once always said 0)."""
    address = qcluster.lc.client_addresses()[2]
    node_id = next(n.node_id for n in qcluster.lc.nodes() if n.client_address == address)
    with raw_conn(address) as s:
        s.sendall(struct.pack(">i", 4321) + os.urandom(17))  # a size no other test uses
        s.shutdown(socket.SHUT_WR)
        expect_closed(s)

    def logged():
        with open(qcluster.lc.log_path(node_id), errors="replace") as f:
            return "truncated frame (17 of 4321 bytes); closing" in f.read()
    wait_for(logged, timeout=5, what=f"the truncated-frame line in node {node_id}'s log")
    assert_serves(qcluster, address)


def test_truncated_frame_held_open_does_not_block_others(qcluster):
    address = qcluster.lc.client_addresses()[1]
    data = apiversions_v3_frame(777, 100)
    assert len(data) == 104
    with raw_conn(address) as s:
        s.sendall(data[:4 + 10])  # size says 100, 10 bytes sent
        # Meanwhile other clients of the same node (and of the others) are served.
        assert_serves(qcluster, address)
        for other in qcluster.lc.client_addresses():
            assert_serves(qcluster, other)
        # The held frame was still being waited for, not dropped: complete it and get the answer.
        s.sendall(data[4 + 10:])
        frame = read_frame(s)
        corr, body = p.QUORUM_API.parse_response(frame, p.API_VERSIONS, 3)
        assert corr == 777 and int(body.error_code) == 0
    assert_serves(qcluster, address)


# -------------------------------------------------------- 3. truncated header


@pytest.mark.parametrize("n", [1, 3, 7])
def test_truncated_header_closes_connection(qcluster, n):
    address = qcluster.lc.client_addresses()[2]
    payload = header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 99)[:n]
    assert len(payload) == n
    before = counters(qcluster, address)["bad_frames"]
    with raw_conn(address) as s:
        s.sendall(framed(payload))
        expect_closed(s)
    assert wait_counter(qcluster, address, "bad_frames", before + 1) == before + 1
    assert_serves(qcluster, address)


# ---------------------------------------------------------- 4. unknown API key


@pytest.mark.parametrize("api_key", [9999, 0, -1, 10003, 32767],
                         ids=["9999", "produce", "minus-one", "past-pidquorum-apis", "int16-max"])
def test_unknown_api_key_closes_connection(qcluster, api_key):
    address = qcluster.lc.client_addresses()[0]
    before = counters(qcluster, address)["bad_frames"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(api_key, 0, 31337) + alloc_body(1, 1)))
        expect_closed(s)
    assert wait_counter(qcluster, address, "bad_frames", before + 1) == before + 1
    assert_serves(qcluster, address)


def test_unknown_api_key_after_valid_requests_flushes_their_answers(qcluster):
    """Requests read before the bad frame are still answered, in order, then the connection closes."""
    address = qcluster.lc.client_addresses()[1]
    good1 = kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 0), 11)
    good2 = p.encode_admin_request({}, 12)
    with raw_conn(address) as s:
        s.sendall(good1 + good2 + framed(header_v2(9999, 0, 13)))
        data = read_until_closed(s)
    frames = []
    while data:
        assert len(data) >= 4
        size = struct.unpack_from(">i", data)[0]
        frames.append(data[4:4 + size])
        data = data[4 + size:]
    assert [corr_of(f) for f in frames] == [11, 12]
    assert int(p.QUORUM_API.parse_response(frames[0], p.API_VERSIONS, 0)[1].error_code) == 0
    assert p.QUORUM_API.parse_response(frames[1], p.ADMIN_API_KEY, 0)[1]["error_code"] == 0
    assert_serves(qcluster, address)


# ----------------------------------------------------- 5. unsupported version


def test_unsupported_allocate_version_closes_the_connection(qcluster):
    """As Kafka does: a version outside the advertised range is not answered (an answer in another
    version's layout would be misread); counted, and the node serves on."""
    address = qcluster.lc.client_addresses()[2]
    before = counters(qcluster, address)["unsupported_versions"]
    with raw_conn(address) as s:
        s.sendall(framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 7, 0x0A0B0C0D) + alloc_body(1, 1)))
        assert read_until_closed(s) == b""
    assert wait_counter(qcluster, address, "unsupported_versions", before + 1) == before + 1
    assert_serves(qcluster, address)


def _parse_api_versions_v0(frame: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    corr, code, n = struct.unpack_from(">ihi", frame)
    off = 10
    assert 0 <= n <= 1000, n
    keys = {}
    for _ in range(n):
        k, lo, hi = struct.unpack_from(">hhh", frame, off)
        keys[k] = (lo, hi)
        off += 6
    assert off == len(frame), f"{len(frame) - off} bytes after the ApiVersions v0 response"
    return corr, code, keys


@pytest.mark.parametrize("version", [9, 4, 32767, -1])
def test_unsupported_api_versions_version_answers_35_in_v0(qcluster, version):
    address = qcluster.lc.client_addresses()[0]
    with raw_conn(address) as s:
        # Body as a v3+ client would send it; the server must not need to read it.
        s.sendall(framed(header_v2(p.API_VERSIONS, version, 0x13572468) + b"\x02t\x021\x00"))
        frame = read_frame(s)
    corr, code, keys = _parse_api_versions_v0(frame)
    assert corr == 0x13572468
    assert code == Errors.UNSUPPORTED_VERSION == 35
    assert keys.get(p.ALLOCATE_PRODUCER_IDS) == (0, 0), keys
    assert keys.get(p.API_VERSIONS) == (0, 3), keys
    assert keys == {k: v for k, v in p.SUPPORTED.items()}
    assert_serves(qcluster, address)


# ------------------------------------ 8. garbage connections, and pipelining


def test_many_garbage_connections(qcluster):
    address = qcluster.lc.client_addresses()[0]
    assert_serves(qcluster, address)  # forwarding connections exist before the baseline
    pid = node_pid(qcluster, address)
    baseline = open_fds(pid)
    before = counters(qcluster, address)["bad_frames"]
    rng = random.Random(20240607)
    for i in range(50):
        junk = rng.randbytes(rng.randrange(1, 300))
        if i % 2:  # a plausible size, so the junk reaches the header parser
            junk = struct.pack(">i", len(junk)) + junk
        with raw_conn(address) as s:
            try:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                continue  # already closed by the server
            read_until_closed(s)  # whatever it says, it must close: we sent nothing more
    assert wait_counter(qcluster, address, "bad_frames", before + 25) >= before + 25
    assert_serves(qcluster, address)
    # Every one of those connections was released by the node.
    wait_for(lambda: open_fds(pid) <= baseline + 5, timeout=10, what=f"fds of node pid {pid} back near {baseline}")

    # Many half-sent frames held open at once: the node keeps serving, and frees them all on close.
    held = []
    try:
        before_held = open_fds(pid)
        for _ in range(50):
            s = raw_conn(address)
            held.append(s)
            s.sendall(struct.pack(">i", 1000) + rng.randbytes(10))
        # (slack: a few connections of earlier checks may still be closing when counted)
        wait_for(lambda: open_fds(pid) >= before_held + 40, timeout=10,
                 what=f"the held connections to be accepted (fds before: {before_held})")
        assert_serves(qcluster, address)
    finally:
        for s in held:
            s.close()
    wait_for(lambda: open_fds(pid) <= baseline + 5, timeout=10, what=f"fds of node pid {pid} back near {baseline}")
    assert_serves(qcluster, address)


def test_pipelined_requests_answered_in_order(qcluster):
    # On a follower, allocations are forwarded (slow) while ApiVersions is local (fast):
    # a server that wrote answers as they complete would reorder them.
    address = follower_address(qcluster)

    broker_id, epoch = run(register_new_broker(address))
    alloc = kafka.request_entity(p.ALLOCATE_PRODUCER_IDS, 0, broker_id=p.i32(broker_id), broker_epoch=p.i64(epoch))
    apiv = kafka.request_entity(p.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    plan = [  # (frame, api key, version, expected error code)
        (kafka.encode_request(alloc, 1001), p.ALLOCATE_PRODUCER_IDS, 0, 0),
        (kafka.encode_request(apiv, 1002), p.API_VERSIONS, 3, 0),
        (kafka.encode_request(alloc, 1003), p.ALLOCATE_PRODUCER_IDS, 0, 0),
        (framed(header_v2(p.API_VERSIONS, 9, 1004) + b"\x02t\x021\x00"), p.API_VERSIONS, 0, 35),
        (p.encode_admin_request({}, 1005), p.ADMIN_API_KEY, 0, 0),
        (framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 0, 1006) + b"\x01"), p.ALLOCATE_PRODUCER_IDS, 0, 42),
        (kafka.encode_request(alloc, 1007), p.ALLOCATE_PRODUCER_IDS, 0, 0),
        (kafka.encode_request(kafka.request_entity(p.API_VERSIONS, 0), 1008), p.API_VERSIONS, 0, 0),
    ]
    # Last, a version the node does not serve: every request before it is answered, then the connection closes.
    unsupported = framed(header_v2(p.ALLOCATE_PRODUCER_IDS, 7, 1009) + alloc_body(broker_id, epoch))
    with raw_conn(address) as s:
        s.sendall(b"".join(f for f, *_ in plan) + unsupported)  # all written before any is read
        frames = [read_frame(s, timeout=15) for _ in plan]
        assert read_until_closed(s, timeout=15) == b""
    assert [corr_of(f) for f in frames] == list(range(1001, 1001 + len(plan)))
    blocks = []
    for frame, (_, key, version, code) in zip(frames, plan):
        corr, body = p.QUORUM_API.parse_response(frame, key, version)
        got = body["error_code"] if isinstance(body, dict) else int(body.error_code)
        assert got == code, (corr, body)
        if key == p.ALLOCATE_PRODUCER_IDS and code == 0:
            blocks.append((int(body.producer_id_start), int(body.producer_id_len)))
    assert len(blocks) == 3
    ranges = sorted(blocks)
    for (s1, l1), (s2, _) in zip(ranges, ranges[1:]):
        assert s1 + l1 <= s2, f"overlapping blocks {ranges}"
    assert_serves(qcluster, address)
