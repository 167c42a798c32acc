"""pidctl user ... (CliRunner), and the wire bounds of the SASL APIs (no network)."""
from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from kio.index import load_request_schema

from cli.main import cli
from quorum.client import api as p
from quorum.security import credentials
from quorum.security.sasl import SASL_API, SASL_NAMES, SASL_SUPPORTED
from records.wire import kafka
from records.wire.bounds import FrameBoundsError, check_request


def invoke(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def test_pidctl_user_add_list_remove(tmp_path):
    path = str(tmp_path / "users.json")
    res = invoke("user", "add", "alice", "--file", path, "--password-stdin", input="s3cret\n")
    assert res.exit_code == 0 and "added" in res.output
    res = invoke("user", "add", "bob", "--file", path, input="pw-bob\npw-bob\n")  # prompt, confirmed
    assert res.exit_code == 0, res.output
    res = invoke("user", "add", "alice", "--file", path, "--password-stdin", input="n3w\n")
    assert res.exit_code == 0 and "updated" in res.output
    res = invoke("user", "list", "--file", path, "-o", "json")
    assert res.exit_code == 0
    assert [u["user"] for u in json.loads(res.output)] == ["alice", "bob"]
    creds = credentials.load(path)
    assert creds.verify_plain("alice", "n3w") and creds.verify_plain("bob", "pw-bob")
    assert "s3cret" not in open(path).read()
    res = invoke("user", "remove", "bob", "--file", path)
    assert res.exit_code == 0
    res = invoke("user", "remove", "bob", "--file", path)
    assert res.exit_code == 1 and "no user 'bob'" in res.output
    res = invoke("user", "add", "__x", "--file", path, "--password-stdin", input="pw\n")
    assert res.exit_code == 1 and "reserved" in res.output
    (tmp_path / "bad.json").write_text("nope")
    res = invoke("user", "list", "--file", str(tmp_path / "bad.json"))
    assert res.exit_code == 1 and "bad.json" in res.output and "Traceback" not in res.output


def test_pidctl_sasl_options_need_credentials():
    res = CliRunner().invoke(cli, ["--security-protocol", "SASL_PLAINTEXT", "acl", "list"])
    assert res.exit_code == 2 and "user name and password" in res.output


@pytest.mark.parametrize("api_key,version", [(k, v) for k, (lo, hi) in SASL_SUPPORTED.items()
                                              for v in range(lo, hi + 1)])
def test_wirecheck_bounds_the_sasl_apis(api_key, version):
    cls = load_request_schema(api_key, version)
    body = cls(mechanism="PLAIN") if api_key == 17 else cls(auth_bytes=b"\0u\0p")
    frame = kafka.encode_request(body, 7, "c")[4:]
    assert check_request(frame, cls.__header_schema__, cls) == len(frame)
    assert SASL_API.parse(frame).body == body
    # claim a huge length for the last field: refused before kio reads it
    if api_key == 36 and cls.__flexible__:
        head = frame[:-len(b"\0u\0p") - 2]  # varint length (1 byte) + 4 bytes + tagged-field count (1 byte)
        bad = head + bytes([0xff, 0xff, 0xff, 0xff, 0x0f]) + b"\0u\0p" + b"\0"
    else:
        size = 2 if api_key == 17 else 4
        n = len(b"PLAIN") if api_key == 17 else 4
        bad = frame[:-(n + size)] + struct.pack(">h" if size == 2 else ">i", 2**15 - 1 if size == 2 else 2**31 - 1) \
            + frame[-n:]
    with pytest.raises(FrameBoundsError):
        check_request(bad, cls.__header_schema__, cls)
    with pytest.raises(kafka.BadRequest) as e:
        SASL_API.parse(bad)
    assert e.value.code.name == "INVALID_REQUEST"


def test_pidctl_acl_takes_exactly_one_resource_and_checks_topic_operations():
    base = ["--quorum", "127.0.0.1:1", "acl", "add", "--principal", "User:alice"]
    res = CliRunner().invoke(cli, [*base, "--operation", "DESCRIBE", "--topic", "t", "--cluster"])
    assert res.exit_code == 2 and "exactly one of --cluster, --transactional-id NAME, --topic NAME or --group NAME" in res.output
    res = CliRunner().invoke(cli, [*base, "--operation", "DESCRIBE", "--cluster", "--prefixed"])
    assert res.exit_code == 2 and "--prefixed applies to --transactional-id, --topic and --group only" in res.output
    # refused before the quorum is asked (nothing listens on port 1)
    res = CliRunner().invoke(cli, [*base, "--operation", "IDEMPOTENT_WRITE", "--topic", "orders-", "--prefixed"])
    assert res.exit_code == 2 and "does not apply to Topic" in res.output
