"""quorum.migration.zk against a real ZooKeeper (see conftest.py): parsing and reading the block znode.
Kafka's ZooKeeper-mode allocation loop is in test_zk_allocation.py, rollback placeholders and bridge
reservations in test_zk_placeholders.py."""
from __future__ import annotations

import time

import pytest

from quorum.localcluster import free_ports
from quorum.migration.zk import (
    LONG_MAX, ZK_BLOCK_PATH, LegacyAllocator, ZkBlock, ZkBlockError, ZkBlockMissing, ZkUnavailable, connect,
    parse_block, read_block,
)
from tests.migration.zk_blocks import DROP, REFERENCE, doc, kafka_json


# ------------------------------------------------------------------ parsing
def test_parse_reference_example():
    block = parse_block(REFERENCE, "export.json")
    assert block == ZkBlock(version=1, broker=35, block_start=4000, block_end=4999)
    assert block.next_start == 5000 and block.length == 1000
    assert block.to_json() == REFERENCE  # byte-for-byte what Kafka writes


@pytest.mark.parametrize("data, expected", [
    (b"", None),
    (None, None),
    (doc(broker=-1), ZkBlock(1, -1, 4000, 4999)),                       # placeholder written by a dual write
    (doc(block_start="0", block_end="0"), ZkBlock(1, 35, 0, 0)),
    (doc(block_end=str(LONG_MAX)), ZkBlock(1, 35, 4000, LONG_MAX)),
    (doc(extra="ignored"), ZkBlock(1, 35, 4000, 4999)),                 # unknown fields are ignored
    (b' {\n  "version": 1,\n  "broker": 35,\n  "block_start": "4000",\n  "block_end": "4999"\n}\n',
     ZkBlock(1, 35, 4000, 4999)),                                        # a pretty-printed export
])
def test_parse_accepts(data, expected):
    assert parse_block(data, "export.json") == expected


MALFORMED = [
    ("invalid-json", b'{"version":1,', "data"),
    ("whitespace-only", b"  \n", "data"),
    ("not-utf8", b'{"version":1,"broker":35,"block_start":"4000","block_end":"\xff"}', "data"),
    ("array", b"[1, 2]", "data"),
    ("string", b'"4000"', "data"),
    ("null", b"null", "data"),
    ("nan", doc(version=1).replace(b'"version": 1', b'"version": NaN'), "data"),
    ("missing-version", doc(version=DROP), "version"),
    ("missing-broker", doc(broker=DROP), "broker"),
    ("missing-block_start", doc(block_start=DROP), "block_start"),
    ("missing-block_end", doc(block_end=DROP), "block_end"),
    ("version-2", doc(version=2), "version"),
    ("version-0", doc(version=0), "version"),
    ("version-string", doc(version="1"), "version"),
    ("version-float", doc(version=1.0), "version"),
    ("version-bool", doc(version=True), "version"),
    ("broker-string", doc(broker="35"), "broker"),
    ("broker-float", doc(broker=35.5), "broker"),
    ("broker-null", doc(broker=None), "broker"),
    ("broker-below-minus-1", doc(broker=-2), "broker"),
    ("broker-beyond-int32", doc(broker=2**31), "broker"),
    ("start-number", doc(block_start=4000), "block_start"),
    ("start-float-string", doc(block_start="4000.0"), "block_start"),
    ("start-exponent", doc(block_start="4e3"), "block_start"),
    ("start-plus", doc(block_start="+4000"), "block_start"),
    ("start-leading-space", doc(block_start=" 4000"), "block_start"),
    ("start-trailing-newline", doc(block_start="4000\n"), "block_start"),
    ("start-leading-junk", doc(block_start="x4000"), "block_start"),
    ("start-trailing-junk", doc(block_start="4000abc"), "block_start"),
    ("start-hex", doc(block_start="0x4000"), "block_start"),
    ("start-underscore", doc(block_start="4_000"), "block_start"),
    ("start-fullwidth-digits", doc(block_start="\uff14\uff10\uff10\uff10"), "block_start"),
    ("start-empty", doc(block_start=""), "block_start"),
    ("start-leading-zeros", doc(block_start="04000"), "block_start"),
    ("start-negative", doc(block_start="-1"), "block_start"),
    ("start-negative-zero", doc(block_start="-0"), "block_start"),
    ("start-beyond-long", doc(block_start=str(LONG_MAX + 1), block_end=str(LONG_MAX + 2)), "block_start"),
    ("start-huge", doc(block_start="9" * 5000), "block_start"),
    ("end-number", doc(block_end=4999), "block_end"),
    ("end-null", doc(block_end=None), "block_end"),
    ("end-float-string", doc(block_end="4999.5"), "block_end"),
    ("end-negative", doc(block_end="-5"), "block_end"),
    ("end-beyond-long", doc(block_end=str(LONG_MAX + 1)), "block_end"),
    ("end-below-start", doc(block_end="3999"), "block_end"),
    ("duplicate-block_end", b'{"version":1,"broker":35,"block_start":"4000","block_end":"4999","block_end":"9"}',
     "block_end"),
]


@pytest.mark.parametrize("data, field", [(d, f) for _, d, f in MALFORMED], ids=[name for name, _, _ in MALFORMED])
def test_parse_refuses_naming_the_field(data, field):
    with pytest.raises(ZkBlockError) as info:
        parse_block(data, "export.json")
    e = info.value
    assert e.field == field
    assert e.origin == "export.json"
    assert str(e).startswith(f"export.json: field '{field}': ")


def test_parse_error_messages_say_what_is_wrong():
    def msg(data):
        with pytest.raises(ZkBlockError) as info:
            parse_block(data, "x")
        return info.value.problem
    assert "unknown version 2" in msg(doc(version=2))
    assert "negative" in msg(doc(block_start="-1"))
    assert "leading zeros" in msg(doc(block_start="04000"))
    assert "Long.MAX" in msg(doc(block_end=str(LONG_MAX + 1)))
    assert "below block_start" in msg(doc(block_end="3999"))
    assert "missing" in msg(doc(broker=DROP))


# ------------------------------------------------------------------ reading
def test_read_block_absent_empty_present(zk_client):
    with pytest.raises(ZkBlockMissing, match="does not exist"):
        read_block(zk_client)
    zk_client.create(ZK_BLOCK_PATH, b"")
    assert read_block(zk_client) == (None, 0)
    zk_client.set(ZK_BLOCK_PATH, REFERENCE)
    assert read_block(zk_client) == (ZkBlock(1, 35, 4000, 4999), 1)


def test_read_block_refuses_malformed_znode(zk_client):
    zk_client.create(ZK_BLOCK_PATH, doc(block_start="4000.0"))
    with pytest.raises(ZkBlockError) as info:
        read_block(zk_client)
    assert info.value.field == "block_start"
    assert ZK_BLOCK_PATH in info.value.origin


def test_connect_creates_chroot_only_when_asked(zk_chroot, zk_client):
    sub = f"{zk_chroot}/sub"
    zk = connect(sub, timeout=10)
    try:
        with pytest.raises(ZkBlockMissing):
            read_block(zk)
        assert zk_client.exists("/sub") is None
    finally:
        zk.stop(); zk.close()
    zk = connect(sub, timeout=10, ensure_chroot=True)
    try:
        assert zk_client.exists("/sub") is not None
        assert LegacyAllocator(zk, broker_id=1).allocate() == (0, 1000)
        assert zk_client.get("/sub" + ZK_BLOCK_PATH)[0] == kafka_json(1, 0, 999)
    finally:
        zk.stop(); zk.close()


def test_connect_unreachable_is_a_clear_error():
    port = free_ports(1)[0]  # nothing listens there
    began = time.monotonic()
    with pytest.raises(ZkUnavailable, match=f"127.0.0.1:{port}"):
        connect(f"127.0.0.1:{port}", timeout=1.0)
    assert time.monotonic() - began < 10
