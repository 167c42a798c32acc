"""Property tests of every request decoder, in-process: for every API and version in the
quorum's and the broker's supported-API tables (so APIs added later are covered), valid
requests built from kio's schemas decode to what was sent, and structured corruptions
(truncation, huge or negative lengths, bad varints and tagged fields, other versions and
API keys, spliced bodies) end in the documented outcome: FrameError (the connection is
closed) or BadRequest with INVALID_REQUEST / UNSUPPORTED_VERSION, whose error answer
encodes.  Every decoded request's fallback error answer encodes too.

tests/quorum/test_wirecheck.py mutates a few fixed frames 20,000 times; this file draws
the frames themselves, for every API the servers serve.
"""
from __future__ import annotations

import random
import struct
import tracemalloc
import uuid
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.metadata.v10.request import MetadataRequest, MetadataRequestTopic

from broker.frontend import SUPPORTED as BROKER
from quorum.client import api as p
from quorum.rpcs import SERVER_API
from tests.fuzz import inputs as F
from records.wire import kafka
from records.wire.errors import Errors

pytestmark = pytest.mark.usefixtures("memory_bound")
SERVERS = ("quorum", "broker")


def _parse(server: str, frame: bytes) -> kafka.Request:
    return F.server_api(server).parse(frame)


def test_every_supported_api_is_fuzzed():
    """The tables are the source: every key and version of both servers is a target (the quorum's
    Envelope, which only nodes send, included)."""
    for server, table in (("quorum", SERVER_API.versions), ("broker", BROKER)):
        got = {(a.api_key, a.version) for a in F.kafka_apis(server)}
        assert got == {(k, v) for k, (lo, hi) in table.items() for v in range(lo, hi + 1)}
    assert set(F.RPC_REQUESTS) == set(p.RPC_RESPONSES)


@pytest.mark.parametrize("server", SERVERS)
@settings(max_examples=F.examples(250))
@given(data=st.data())
def test_valid_requests_decode_to_what_was_sent(server, data):
    src = F.HypothesisSource(data)
    api = src.choice(F.kafka_apis(server))
    frame, body = F.valid_request(api, src)
    req = _parse(server, frame)
    assert (req.api_key, req.api_version, req.body) == (api.api_key, api.version, body)
    assert F.check_request_decoder(server, frame).startswith("decoded:")


@pytest.mark.parametrize("server", SERVERS)
@settings(max_examples=F.examples(600))
@given(data=st.data())
def test_corrupted_requests_get_the_documented_outcome(server, data):
    src = F.HypothesisSource(data)
    frame, _ = F.fuzz_frame(server, src)
    F.check_request_decoder(server, frame)


@settings(max_examples=F.examples(600))
@given(data=st.data())
def test_msgpack_api_requests(data):
    """DescribeState and the record RPCs (API keys 10001 / 10002): valid bodies decode to the
    record sent, corrupted ones are INVALID_REQUEST."""
    src = F.HypothesisSource(data)
    frame, how = F.msgpack_request(src)
    outcome = F.check_request_decoder("quorum", frame)
    if how == "valid":
        assert outcome == f"decoded:{p.RECORD_API_KEY}"
    elif how in ("wrong-field", "unknown-type", "bad-version", "field-count", "shape"):
        assert outcome == "bad-request:INVALID_REQUEST"


@settings(max_examples=F.examples(300))
@given(frame=st.binary(max_size=200), key=st.sampled_from(sorted(set(p.SUPPORTED) | set(F.broker_tables()[0])
                                                                  | set(p.QUORUM_API.msgpack))),
       version=st.integers(-(2**15), 2**15 - 1))
def test_any_bytes_after_a_supported_header(frame, key, version):
    data = struct.pack(">hhi", key, version, 1) + frame
    for server in SERVERS:
        F.check_request_decoder(server, data)


@pytest.mark.parametrize("server,seed", [("quorum", 7001), ("broker", 7002)])
def test_seeded_mutations_of_every_api(server, seed):
    """6,000 seeded inputs per server (reproducible: ``RandomSource(random.Random(seed))``)."""
    src = F.RandomSource(random.Random(seed))
    outcomes = Counter()
    for _ in range(F.examples(6_000)):
        frame, _ = F.fuzz_frame(server, src)
        outcomes[F.check_request_decoder(server, frame).split(":")[0]] += 1
    # every outcome is reached, so the inputs are not all refused at the first byte
    assert outcomes["decoded"] and outcomes["bad-request"] and outcomes["frame-error"], outcomes


def test_decoder_memory_is_bounded_by_the_frame():
    """Python-side allocation while decoding (tracemalloc peak) stays within a small multiple
    of the frame; the native reader is bounded by wirecheck (and by ``memory_bound``)."""
    src = F.RandomSource(random.Random(7003))
    worst = (0, b"")
    tracemalloc.start()
    try:
        for i in range(F.examples(1500)):
            server = SERVERS[i % 2]
            frame, _ = F.fuzz_frame(server, src)
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            F.check_request_decoder(server, frame)
            peak = tracemalloc.get_traced_memory()[1] - base
            if peak - 64 * len(frame) > worst[0]:
                worst = (peak - 64 * len(frame), frame)
    finally:
        tracemalloc.stop()
    assert worst[0] < 4 * 1024 * 1024, f"decoding {worst[1][:64].hex()} allocated {worst[0]} bytes over 64x its size"


# ------------------------------------------------------------ regressions


def test_null_non_nullable_array_is_invalid_request_not_none():
    """Found by this fuzzer: kio read a null (-1) non-nullable array as None, and the broker's
    handlers and error answers then failed on it (Produce topic_data, ListOffsets topics ...)."""
    hdr = struct.pack(">hhih", 0, 3, 11, 1) + b"c"
    body = struct.pack(">h", -1) + struct.pack(">hi", -1, 5000) + struct.pack(">i", -1)  # topic_data: null
    with pytest.raises(kafka.BadRequest) as ei:
        _parse("broker", hdr + body)
    assert ei.value.code == Errors.INVALID_REQUEST and "topic_data: null array" in ei.value.message
    assert F.check_request_decoder("broker", hdr + body) == "bad-request:INVALID_REQUEST"
    # a nullable one (Metadata v1 topics: null means all topics) is still accepted
    md = struct.pack(">hhih", 3, 1, 12, 1) + b"c" + struct.pack(">i", -1)
    assert _parse("broker", md).body.topics is None


def test_metadata_v10_topic_without_name_gets_an_answer():
    """Found by this fuzzer: a Metadata v10/v11 topic asked for by id (name null, valid) made
    the broker build an answer v10-v11 cannot carry; the connection died unanswered."""
    body = MetadataRequest(topics=(MetadataRequestTopic(topic_id=uuid.uuid4(), name=None),),
                           allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                           include_topic_authorized_operations=False)
    frame = F.encode_frame(3, 10, body)
    assert F.check_request_decoder("broker", frame) == "decoded:3"
