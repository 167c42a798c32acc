"""Server side of the SASL mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256 (RFC 5802 / 7677).

Pure: each ``step(token)`` takes the client's bytes and returns the server's
bytes, or raises ``AuthenticationFailed`` with the message the client is told.
Kafka's wording is kept ("Authentication failed: Invalid username or
password"), and an unknown user is answered exactly like a wrong password: in
PLAIN with the same work, in SCRAM with a mock salt and iteration count that
stay the same for that name (``Credentials.mock``), where Kafka fails the
exchange at the first message and so tells a known user from an unknown one.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from .credentials import Credentials, ScramCredential, client_key, salted_password

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
MECHANISMS = (PLAIN, SCRAM_SHA_256)
MAX_TOKEN_BYTES = 4096


class AuthenticationFailed(Exception):
    """The exchange failed; ``str(e)`` is what the client is told."""


class Mechanism:
    name = ""
    done = False
    user: str | None = None

    def step(self, token: bytes) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError


class PlainServer(Mechanism):
    """``[authzid] NUL authcid NUL passwd``, one message."""

    name = PLAIN

    def __init__(self, creds: Credentials):
        self.creds = creds

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise AuthenticationFailed("Authentication failed: the PLAIN exchange is already complete")
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationFailed(f"Invalid SASL/PLAIN response: {len(token)} bytes (at most {MAX_TOKEN_BYTES})")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: expected 3 tokens, got "
                                       f"{len(parts)}")
        try:
            authzid, user, password = (x.decode("utf-8") for x in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is "
                                       "different from username")
        if not self.creds.verify_plain(user, password):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self.user, self.done = user, True
        return b""


def _attrs(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthenticationFailed(f"Invalid SCRAM message: bad attribute {part[:20]!r}")
        out.setdefault(part[0], part[2:])
    return out


def _saslname(name: str) -> str:
    """RFC 5802: '=2C' is ',' and '=3D' is '='; any other '=' is an error."""
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i:i + 3]
            if code not in ("=2C", "=3D"):
                raise AuthenticationFailed("Invalid SCRAM message: bad escape in the user name")
            out.append("," if code == "=2C" else "=")
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


class ScramServer(Mechanism):
    """SCRAM-SHA-256: client-first, server-first, client-final, server-final."""

    name = SCRAM_SHA_256

    def __init__(self, creds: Credentials, nonce: str | None = None):
        self.creds = creds
        self.state = "first"
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self._cred: ScramCredential | None = None

    def step(self, token: bytes) -> bytes:
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationFailed(f"Invalid SCRAM message: {len(token)} bytes (at most {MAX_TOKEN_BYTES})")
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid SCRAM message: not UTF-8") from None
        if self.state == "first":
            return self._first(message)
        if self.state == "final":
            return self._final(message)
        raise AuthenticationFailed("Authentication failed: the SCRAM exchange is already complete")

    def _first(self, message: str) -> bytes:
        gs2, sep, bare = message.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y"):
            raise AuthenticationFailed("Invalid SCRAM client-first message (channel binding is not supported)")
        a = _attrs(bare)
        if "n" not in a or "r" not in a or not a["r"]:
            raise AuthenticationFailed("Invalid SCRAM client-first message: user name or nonce missing")
        user = _saslname(a["n"])
        if authzid and _saslname(authzid[2:] if authzid.startswith("a=") else "\0") != user:
            raise AuthenticationFailed("Authentication failed: Client requested an authorization id that is "
                                       "different from username")
        cred = self.creds.get(user)
        if cred is None:
            # Answered like a known user, with a salt that stays the same for that name; the proof then fails
            # as a wrong password does (Kafka fails here at once, which tells who exists).
            cred = self.creds.mock(user)
        self.user, self._cred = user, cred
        self._client_first_bare = bare
        self._nonce = a["r"] + self._nonce
        self._server_first = f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
        self.state = "final"
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        without_proof, sep, proof_part = message.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("Invalid SCRAM client-final message: no proof")
        a = _attrs(without_proof)
        if a.get("r") != self._nonce:
            raise AuthenticationFailed("Invalid SCRAM client-final message: nonce mismatch")
        if a.get("c") not in ("biws", "eSws"):  # base64 of "n,," and "y,,"
            raise AuthenticationFailed("Invalid SCRAM client-final message: channel binding is not supported")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except (binascii.Error, ValueError):
            raise AuthenticationFailed("Invalid SCRAM client-final message: proof is not base64") from None
        assert self._cred is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.new(self._cred.stored_key, auth_message, hashlib.sha256).digest()
        if len(proof) != len(signature):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        key = bytes(x ^ y for x, y in zip(proof, signature))
        if not hmac.compare_digest(hashlib.sha256(key).digest(), self._cred.stored_key):
            raise AuthenticationFailed("Authentication failed: Invalid username or password")
        self.state, self.done = "done", True
        server_signature = hmac.new(self._cred.server_key, auth_message, hashlib.sha256).digest()
        return b"v=" + base64.b64encode(server_signature)


class ScramClient:
    """The client side (pidctl, brokers, the nodes' forwards may use it); also used by tests."""

    def __init__(self, user: str, password: str, nonce: str | None = None):
        self.user, self.password = user, password
        self._nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()

    def first(self) -> bytes:
        name = self.user.replace("=", "=3D").replace(",", "=2C")
        self._bare = f"n={name},r={self._nonce}"
        return ("n,," + self._bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        a = _attrs(text)
        if not a.get("r", "").startswith(self._nonce):
            raise AuthenticationFailed("server nonce does not extend the client nonce")
        salted = salted_password(self.password, base64.b64decode(a["s"]), int(a["i"]))
        ck = client_key(salted)
        without_proof = f"c=biws,r={a['r']}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = hmac.new(hashlib.sha256(ck).digest(), auth_message, hashlib.sha256).digest()
        self._expected = hmac.new(hmac.new(salted, b"Server Key", hashlib.sha256).digest(), auth_message,
                                  hashlib.sha256).digest()
        return f"{without_proof},p={base64.b64encode(bytes(x ^ y for x, y in zip(ck, signature))).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        if server_final != b"v=" + base64.b64encode(self._expected):
            raise AuthenticationFailed("the server's SCRAM signature is wrong")


def server_mechanism(name: str, creds: Credentials) -> Mechanism:
    if name == PLAIN:
        return PlainServer(creds)
    if name == SCRAM_SHA_256:
        return ScramServer(creds)
    raise ValueError(f"unknown mechanism {name}")  # pragma: no cover - checked by the handshake
