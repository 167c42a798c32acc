"""The credentials file and the server side of PLAIN and SCRAM-SHA-256 (no network)."""
from __future__ import annotations

import base64
import json
import os
import stat

import pytest

from quorum.security import credentials as c
from quorum.security.mechanisms import AuthenticationFailed, PlainServer, ScramClient, ScramServer


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "users.json")
    assert c.add_user(p, "alice", "alice-secret") is True
    assert c.add_user(p, "bob", "bob-secret") is True
    return p


def test_add_update_remove_and_list(path):
    raw = open(path).read()
    assert "alice-secret" not in raw and "bob-secret" not in raw  # only hashes
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    creds = c.load(path)
    assert creds.verify_plain("alice", "alice-secret")
    assert not creds.verify_plain("alice", "bob-secret")
    assert not creds.verify_plain("nobody", "alice-secret")
    salt_before = creds.get("alice").salt
    assert c.add_user(path, "alice", "new-password") is False  # update
    creds = c.load(path)
    assert creds.verify_plain("alice", "new-password") and not creds.verify_plain("alice", "alice-secret")
    assert creds.get("alice").salt != salt_before  # a new salt every time
    assert creds.get("alice").salt != creds.get("bob").salt  # per-user salt
    assert [u["user"] for u in c.list_users(path)] == ["alice", "bob"]
    assert c.remove_user(path, "bob") is True
    assert c.remove_user(path, "bob") is False
    assert [u["user"] for u in c.list_users(path)] == ["alice"]
    assert not [f for f in os.listdir(os.path.dirname(path)) if f.startswith(".credentials-")]  # no temp files


@pytest.mark.parametrize("user,password,fragment", [
    ("", "pw", "1..255"),
    ("__node", "pw", "reserved"),
    ("a,b", "pw", "not allowed"),
    ("a b", "pw", "not allowed"),
    ("alice", "", "empty"),
    ("alice", "a\0b", "NUL"),
])
def test_bad_names_and_passwords(tmp_path, user, password, fragment):
    with pytest.raises(c.CredentialsError, match=fragment):
        c.add_user(str(tmp_path / "u.json"), user, password)
    assert not os.path.exists(tmp_path / "u.json")


@pytest.mark.parametrize("content,fragment", [
    (b"\xff\xfe", "invalid JSON"),
    (b"{not json", "invalid JSON"),
    (b"[]", "not a credentials file"),
    (json.dumps({"format": "pidquorum-credentials", "version": 9, "users": {}}).encode(), "version 9"),
    (json.dumps({"format": "pidquorum-credentials", "version": 1, "users": []}).encode(), "users"),
    (json.dumps({"format": "pidquorum-credentials", "version": 1,
                 "users": {"a": {"mechanism": "MD5"}}}).encode(), "unsupported mechanism"),
    (json.dumps({"format": "pidquorum-credentials", "version": 1,
                 "users": {"a": {"mechanism": "SCRAM-SHA-256", "iterations": 1}}}).encode(), "iterations"),
    (json.dumps({"format": "pidquorum-credentials", "version": 1,
                 "users": {"a": {"mechanism": "SCRAM-SHA-256", "iterations": 4096, "salt": "!!",
                                 "stored_key": "", "server_key": ""}}}).encode(), "not base64"),
])
def test_corrupt_file_names_the_file(tmp_path, content, fragment):
    p = tmp_path / "broken.json"
    p.write_bytes(content)
    with pytest.raises(c.CredentialsError, match=fragment) as e:
        c.load(str(p))
    assert str(p) in str(e.value)
    with pytest.raises(c.CredentialsError, match="broken.json"):
        c.add_user(str(p), "alice", "pw")  # never overwrites a file it cannot read
    assert p.read_bytes() == content


def test_missing_file(tmp_path):
    with pytest.raises(c.CredentialsError, match="cannot read"):
        c.load(str(tmp_path / "nope.json"))


def test_store_reloads_a_changed_file_and_keeps_the_old_users_if_broken(path):
    store = c.CredentialsStore(path)
    assert store.current().verify_plain("bob", "bob-secret")
    c.add_user(path, "carol", "carol-secret")
    assert store.current().verify_plain("carol", "carol-secret")
    with open(path, "w") as f:
        f.write("garbage, and longer than before so the size changes for sure")
    assert store.current().verify_plain("carol", "carol-secret")  # still the users read before


# ----------------------------------------------------------------- PLAIN
def test_plain(path):
    creds = c.load(path)
    m = PlainServer(creds)
    assert m.step(b"\0alice\0alice-secret") == b"" and m.done and m.user == "alice"
    assert PlainServer(creds).step(b"alice\0alice\0alice-secret") == b""  # authzid = user is fine


@pytest.mark.parametrize("token,fragment", [
    (b"\0alice\0wrong", "Invalid username or password"),
    (b"\0mallory\0alice-secret", "Invalid username or password"),  # unknown user: the same answer
    (b"alice-secret", "expected 3 tokens"),
    (b"\0alice\0x\0y", "expected 3 tokens"),
    (b"\0\0pw", "username not specified"),
    (b"\0alice\0", "password not specified"),
    (b"bob\0alice\0alice-secret", "authorization id"),
    (b"\0al\xffice\0pw", "UTF-8"),
    (b"\0" * 5000, "at most"),
])
def test_plain_refusals(path, token, fragment):
    with pytest.raises(AuthenticationFailed, match=fragment):
        PlainServer(c.load(path)).step(token)


# ----------------------------------------------------------------- SCRAM
def test_scram_exchange_and_wrong_password(path):
    creds = c.load(path)
    client, server = ScramClient("alice", "alice-secret"), ScramServer(creds)
    server_first = server.step(client.first())
    final = server.step(client.final(server_first))
    client.verify(final)
    assert server.done and server.user == "alice"

    client, server = ScramClient("alice", "wrong"), ScramServer(creds)
    with pytest.raises(AuthenticationFailed, match="Invalid username or password"):
        server.step(client.final(server.step(client.first())))
    assert not server.done
    client, server = ScramClient("mallory", "x"), ScramServer(creds)
    with pytest.raises(AuthenticationFailed, match="Invalid username or password"):  # as a wrong password
        server.step(client.final(server.step(client.first())))


def _salt_and_iterations(server_first: bytes) -> tuple[str, str]:
    attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
    return attrs["s"], attrs["i"]


def test_scram_answers_an_unknown_user_like_a_known_one_with_a_salt_that_stays_the_same(path):
    """RFC 5802 5.1: a mock salt and iteration count.  Kafka fails an unknown user at the first message, which
    tells anyone who can connect which user names exist."""
    creds = c.load(path)
    known = ScramServer(creds).step(ScramClient("alice", "x").first())
    unknown = [ScramServer(creds).step(ScramClient("mallory", "x").first()) for _ in range(3)]
    salt, iterations = _salt_and_iterations(unknown[0])
    assert all(_salt_and_iterations(u) == (salt, iterations) for u in unknown)  # the same every time
    assert len(base64.b64decode(salt)) == len(base64.b64decode(_salt_and_iterations(known)[0]))
    assert iterations == _salt_and_iterations(known)[1]
    assert _salt_and_iterations(ScramServer(creds).step(ScramClient("trudy", "x").first()))[0] != salt
    assert _salt_and_iterations(ScramServer(c.load(path)).step(ScramClient("mallory", "x").first()))[0] == salt


def test_scram_rfc7677_test_vector():
    # RFC 7677 section 3: user "user", password "pencil", salt W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations.
    cred = c.make_credential("pencil", 4096, base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    creds = c.Credentials("mem", {"user": cred})
    server = ScramServer(creds, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.mark.parametrize("first,fragment", [
    (b"p=tls-unique,,n=alice,r=x", "channel binding"),
    (b"n,,r=x", "missing"),
    (b"n,,n=al=ZZice,r=x", "escape"),
    (b"garbage", "client-first"),
])
def test_scram_malformed(path, first, fragment):
    with pytest.raises(AuthenticationFailed, match=fragment):
        ScramServer(c.load(path)).step(first)
