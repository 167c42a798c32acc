"""The per-connection SASL gate, driven directly with frames (no sockets)."""
from __future__ import annotations

import asyncio
import random
import struct

import pytest

from quorum.client import api as p
from quorum.security import credentials
from quorum.security.sasl import SaslAuthenticator
from records.wire import kafka


@pytest.fixture
def auth(tmp_path):
    path = str(tmp_path / "users.json")
    credentials.add_user(path, "alice", "alice-pw")
    return SaslAuthenticator(path, counters={})


def req(api_key, version, corr=1, **fields) -> bytes:
    return kafka.encode_request(kafka.request_entity(api_key, version, **fields), corr, "t")[4:]


def answer(verdict, api_key, version):
    return p.QUORUM_API.parse_response(verdict.data[4:], api_key, version)[1]


def test_principal_is_set_only_after_success(auth):
    s = auth.session(("127.0.0.1", 1))

    async def go():
        assert (await s.on_frame(req(18, 3, client_software_name="t", client_software_version="1"))).kind == "pass"
        assert s.principal == "User:ANONYMOUS"
        v = await s.on_frame(req(17, 1, mechanism="PLAIN"))
        assert v.kind == "reply" and not v.close
        v = await s.on_frame(req(36, 2, auth_bytes=b"\0alice\0alice-pw"))
        assert int(answer(v, 36, 2).error_code) == 0 and s.authenticated and s.principal == "User:alice"
        assert (await s.on_frame(req(67, 0, broker_id=p.i32(1), broker_epoch=p.i64(1)))).kind == "pass"
    asyncio.run(go())
    assert auth.counters["sasl_authenticated"] == 1


def test_random_frames_never_break_the_gate(auth, caplog):
    rnd = random.Random(7)

    async def go():
        closes = replies = 0
        for i in range(600):
            s = auth.session(("127.0.0.1", i))
            for _ in range(rnd.randint(1, 4)):
                kind = rnd.random()
                if kind < 0.4:  # a SASL header with random bytes after it
                    api = rnd.choice([17, 36])
                    frame = struct.pack(">hhi", api, rnd.randint(-1, 4), i) + rnd.randbytes(rnd.randint(0, 40))
                elif kind < 0.7:  # a well-formed handshake or authenticate with random tokens
                    frame = req(17, rnd.randint(0, 1), mechanism=rnd.choice(["PLAIN", "SCRAM-SHA-256", "X" * 300]))
                    if rnd.random() < 0.5:
                        frame = req(36, rnd.randint(0, 2), auth_bytes=rnd.randbytes(rnd.randint(0, 64)))
                else:
                    frame = rnd.randbytes(rnd.randint(0, 30))
                v = await s.on_frame(frame)
                assert v.kind in ("pass", "reply", "close")
                if v.kind == "reply":
                    replies += 1
                    assert struct.unpack(">i", v.data[:4])[0] == len(v.data) - 4
                if v.kind == "close" or v.close:
                    closes += 1
                    break
                assert not s.authenticated or s.principal == "User:alice"
        return closes, replies
    closes, replies = asyncio.run(go())
    assert closes > 100 and replies > 100
    assert auth.counters["sasl_authenticated"] == 0  # random bytes never authenticate
    assert not [r for r in caplog.records if "SASL gate failed" in r.getMessage()]  # no bug hit the catch-all


def test_unsupported_version_of_a_sasl_api_closes_the_connection(auth):
    """As Kafka's SaslServerAuthenticator does: the request cannot be parsed, the connection is closed
    (no answer in another version's layout)."""
    s = auth.session(None)
    frame = struct.pack(">hhi", 17, 9, 5) + struct.pack(">h", 1) + b"t" + struct.pack(">h", 5) + b"PLAIN"
    v = asyncio.run(s.on_frame(frame))
    assert v.kind == "close" and "SaslHandshake v9 is not supported" in v.reason
