"""records.wire.kafka.ApiTable.parse on hand-built frames, no server: what closes the connection (FrameError)
and what is answered (BadRequest), as Kafka decides it."""
from __future__ import annotations

import logging
import struct

import msgpack
import pytest

from quorum.client import api as p
from quorum.telemetry.logs import FirstOfEach
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE, METADATA = 0, 3
TABLE = kafka.ApiTable(versions={kafka.API_VERSIONS: (0, 3), PRODUCE: (3, 10), METADATA: (0, 12)},
                       names={kafka.API_VERSIONS: "ApiVersions", PRODUCE: "Produce", METADATA: "Metadata"},
                       error_body=lambda key, version, code, message, throttle_ms: None,
                       msgpack={p.ADMIN_API_KEY: kafka.MsgpackApi(
                           "DescribeState", decode_request=lambda obj: obj, decode_response=lambda obj: obj,
                           encode=lambda body: body, error_body=lambda code, message: {"error_code": int(code),
                                                                                       "error_message": message})})


def header(api_key: int, version: int, corr: int = 9) -> bytes:
    return struct.pack(">hhih", api_key, version, corr, 1) + b"t"


@pytest.mark.parametrize("api_key,version", [(PRODUCE, 2), (PRODUCE, 11), (METADATA, 13), (METADATA, -1)])
def test_a_kafka_api_at_an_unsupported_version_closes_the_connection(api_key, version):
    with pytest.raises(kafka.UnsupportedVersion) as ei:
        TABLE.parse(header(api_key, version) + b"\x00" * 12)
    e = ei.value
    assert isinstance(e, kafka.FrameError) and e.counter == "unsupported_versions"
    assert e.kind == ("unsupported version", api_key, version)
    assert (e.api_key, e.api_version) == (api_key, version) and "is not supported" in str(e)


def test_an_unknown_api_key_closes_the_connection_once_per_key():
    with pytest.raises(kafka.UnknownApi) as ei:
        TABLE.parse(header(67, 0))
    assert ei.value.counter == "bad_frames" and ei.value.kind == ("unknown API key", 67)


def test_a_truncated_header_is_a_plain_frame_error():
    with pytest.raises(kafka.FrameError) as ei:
        TABLE.parse(b"\x00\x12\x00")
    assert type(ei.value) is kafka.FrameError and ei.value.kind is None


@pytest.mark.parametrize("version", [4, 99, -1])
def test_api_versions_at_an_unsupported_version_is_answered_in_v0_with_the_ranges(version):
    with pytest.raises(kafka.BadRequest) as ei:
        TABLE.parse(header(kafka.API_VERSIONS, version, corr=77) + b"\x00" * 3)
    assert ei.value.code == Errors.UNSUPPORTED_VERSION
    assert ei.value.kind == ("unsupported version", kafka.API_VERSIONS, version)  # logged once per version
    corr, body = p.QUORUM_API.parse_response(TABLE.error_response(ei.value)[4:], kafka.API_VERSIONS, 0)
    assert corr == 77 and int(body.error_code) == Errors.UNSUPPORTED_VERSION
    assert {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys} == dict(TABLE.versions)


def test_a_msgpack_api_at_another_version_is_answered():
    """The project's own APIs answer a self-describing msgpack body, which any client version reads."""
    with pytest.raises(kafka.BadRequest) as ei:
        TABLE.parse(header(p.ADMIN_API_KEY, 1, corr=5) + msgpack.packb({}))
    assert ei.value.code == Errors.UNSUPPORTED_VERSION
    corr, body = p.QUORUM_API.parse_response(TABLE.error_response(ei.value)[4:], p.ADMIN_API_KEY, 0)
    assert corr == 5 and body["error_code"] == Errors.UNSUPPORTED_VERSION


def test_error_response_has_no_layout_for_an_unsupported_version():
    with pytest.raises(ValueError):
        TABLE.error_response(kafka.BadRequest(PRODUCE, 11, 1, Errors.INVALID_REQUEST, "x"))


def test_first_of_each_logs_each_kind_once_and_bounds_the_kinds(caplog):
    now = [0.0]
    say = FirstOfEach(logging.getLogger("test.first"), max_kinds=2, interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.first"):
        assert say(("k", 1), logging.WARNING, "saw %s", 1)
        assert not say(("k", 1), logging.WARNING, "saw %s", 1)
        assert say(("k", 2), logging.WARNING, "saw %s", 2)
        assert say(("k", 3), logging.WARNING, "saw %s", 3)  # past max_kinds: throttled, not remembered
        assert not say(("k", 4), logging.WARNING, "saw %s", 4)
        assert not say(("k", 1), logging.WARNING, "saw %s", 1)
        now[0] += 10.0
        assert say(("k", 3), logging.WARNING, "saw %s", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "saw 1 (logged once; the next ones are only counted)",
        "saw 2 (logged once; the next ones are only counted)",
        "saw 3", "saw 3 (1 more like it not logged in the last 10 s)"]


# ------------------------------------------------------------------ tagged fields the schema does not know
def _metadata_v12(header_tags: bytes = b"\x00", topic_tags: bytes = b"\x00", body_tags: bytes = b"\x00") -> bytes:
    """Metadata v12 for topic "x" by hand: header v2 (its tagged section), one topic (its tagged section),
    allow_auto_topic_creation, include_topic_authorized_operations, the body's tagged section."""
    return (struct.pack(">hhih", METADATA, 12, 7, 1) + b"t" + header_tags + b"\x02" + bytes(16) + b"\x02x"
            + topic_tags + b"\x01\x00" + body_tags)


@pytest.mark.parametrize("where", ["header", "topic", "body"])
def test_unknown_tagged_fields_are_skipped_as_kafka_does(where):
    """KIP-482: a tag the version's schema does not know is skipped (a newer client may send one; librdkafka
    2.1 does in Metadata v9+), not refused; the request reads as it would without it."""
    unknown = b"\x02" + b"\x00\x03abc" + b"\x1f\x00"  # two tags: 0 (3 bytes) and 31 (empty)
    frame = _metadata_v12(**{f"{where}_tags": unknown})
    plain = TABLE.parse(_metadata_v12())
    req = TABLE.parse(frame)
    assert req.body == plain.body and req.client_id == "t" and req.correlation_id == 7
    assert req.raw == frame  # what a follower would forward is what arrived


def test_an_unknown_tag_running_past_the_frame_is_still_refused():
    with pytest.raises(kafka.BadRequest) as ei:
        TABLE.parse(_metadata_v12(body_tags=b"\x01\x00\x09abc"))
    assert ei.value.code == Errors.INVALID_REQUEST
