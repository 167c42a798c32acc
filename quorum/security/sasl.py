"""The SASL gate in front of a server's request handling (quorum client port and broker), matching Kafka's
SaslServerAuthenticator.  Each connection has its own ``SaslSession``; only the credentials are shared, so
one client's bad bytes never affect another."""
from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from records.wire import kafka
from records.wire.errors import Errors

from .acl import ANONYMOUS, principal_of
from .credentials import CredentialsStore, ScramCredential
from .mechanisms import MECHANISMS, AuthenticationFailed, Mechanism, server_mechanism

log = logging.getLogger(__name__)

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_SUPPORTED: dict[int, tuple[int, int]] = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
SASL_NAMES = {SASL_HANDSHAKE: "SaslHandshake", SASL_AUTHENTICATE: "SaslAuthenticate"}


@dataclass
class Verdict:
    kind: str  # "pass" | "reply" | "close"
    data: bytes | None = None
    close: bool = False
    reason: str = ""


PASS = Verdict("pass")


def sasl_error_body(api_key: int, version: int, code: Errors, message: str | None = None,
                    mechanisms: tuple[str, ...] = ()) -> Any:
    cls = load_response_schema(api_key, version)
    if api_key == SASL_HANDSHAKE:
        return cls(error_code=ErrorCode(int(code)), mechanisms=tuple(mechanisms))
    return cls(error_code=ErrorCode(int(code)), error_message=message or (code.name if code else None),
               auth_bytes=b"")


SASL_API = kafka.ApiTable(SASL_SUPPORTED, SASL_NAMES,
                          lambda key, version, code, message, throttle_ms: sasl_error_body(key, version, code, message))


class SaslAuthenticator:
    """The SASL settings of one listener; ``session()`` makes the per-connection state."""

    def __init__(self, credentials_file: str, mechanisms: tuple[str, ...] = MECHANISMS,
                 internal_users: dict[str, ScramCredential] | None = None, counters: dict | None = None):
        unknown = [m for m in mechanisms if m not in MECHANISMS]
        if unknown or not mechanisms:
            raise ValueError(f"SASL mechanisms {list(mechanisms)}: each must be one of {', '.join(MECHANISMS)}")
        self.store = CredentialsStore(credentials_file)
        self.mechanisms = tuple(mechanisms)
        self.internal_users = dict(internal_users or {})
        self.counters = counters if counters is not None else {}
        for k in ("sasl_authenticated", "sasl_failed", "sasl_refused_requests"):
            self.counters.setdefault(k, 0)

    def session(self, peer: Any) -> "SaslSession":
        return SaslSession(self, peer)


class SaslSession:
    """One connection's SASL state.  It sees every frame first (``on_frame``) and answers with a ``Verdict``:
    ``pass`` (handle the frame as ``principal``), ``reply`` (send ``data``, then close if ``close``) or
    ``close`` (no answer; ``reason`` is logged).  As Kafka:

    * before authentication only ApiVersions, SaslHandshake (v0-v1) and SaslAuthenticate (v0-v2) are
      served; any other request closes the connection;
    * a handshake for a mechanism not enabled is answered UNSUPPORTED_SASL_MECHANISM with the enabled
      list, then the connection closes; SaslAuthenticate before a handshake, or a second handshake, closes it;
    * failed authentication (wrong password, unknown user, malformed token) is answered
      SASL_AUTHENTICATION_FAILED with a message, then the connection closes;
    * after authentication, SaslHandshake / SaslAuthenticate are answered ILLEGAL_SASL_STATE and the
      connection stays open;
    * a v0 handshake makes the following frames raw SASL tokens (no Kafka header), answered with raw tokens.
    """

    def __init__(self, auth: SaslAuthenticator, peer: Any):
        self.auth = auth
        self.peer = peer
        self.principal = ANONYMOUS
        self.authenticated = False
        self.state = "handshake"  # handshake -> authenticate -> done
        self.mechanism: Mechanism | None = None
        self.raw = False  # after a v0 handshake: frames are raw SASL tokens

    def _fail(self, message: str) -> None:
        self.auth.counters["sasl_failed"] += 1
        log.warning("client %s: SASL authentication failed: %s", self.peer, message)

    async def _step(self, token: bytes) -> bytes:
        assert self.mechanism is not None
        # PBKDF2 takes milliseconds: off the event loop.
        out = await asyncio.get_running_loop().run_in_executor(None, self.mechanism.step, token)
        if self.mechanism.done:
            self.authenticated, self.state = True, "done"
            self.principal = principal_of(self.mechanism.user or "")
            self.auth.counters["sasl_authenticated"] += 1
            log.info("client %s: authenticated as %s (%s)", self.peer, self.principal, self.mechanism.name)
        return out

    async def on_frame(self, frame: bytes) -> Verdict:
        try:
            return await self._on_frame(frame)
        except Exception as e:  # noqa: BLE001 - connection boundary: a bug here closes this connection only
            log.exception("client %s: SASL gate failed", self.peer)
            return Verdict("close", reason=f"internal error in the SASL exchange: {type(e).__name__}")

    async def _on_frame(self, frame: bytes) -> Verdict:
        if self.raw:
            return await self._raw_token(frame)
        if len(frame) < 8:
            return PASS  # the usual parser closes the connection
        api_key = struct.unpack_from(">h", frame)[0]
        if api_key in SASL_SUPPORTED:
            return await self._sasl_request(frame)
        if self.authenticated or api_key == kafka.API_VERSIONS:
            return PASS
        self.auth.counters["sasl_refused_requests"] += 1
        return Verdict("close", reason=f"unexpected request (API key {api_key}) before SASL authentication")

    async def _raw_token(self, frame: bytes) -> Verdict:
        try:
            out = await self._step(frame)
        except AuthenticationFailed as e:
            self._fail(str(e))
            return Verdict("close", reason=f"SASL authentication failed: {e}")
        if self.authenticated:
            self.raw = False
        return Verdict("reply", kafka.SIZE.pack(len(out)) + out)

    async def _sasl_request(self, frame: bytes) -> Verdict:
        try:
            req = SASL_API.parse(frame)
        except kafka.FrameError as e:
            return Verdict("close", reason=str(e))
        except kafka.BadRequest as e:
            msg = e.message
            self._fail(msg)
            data = SASL_API.error_response(e)
            return Verdict("reply", data, close=not self.authenticated, reason=msg)

        def reply(body: Any, close: bool = False, reason: str = "") -> Verdict:
            return Verdict("reply", SASL_API.encode(req.api_key, req.api_version, req.correlation_id, body),
                           close=close, reason=reason)

        if self.authenticated:
            what = SASL_NAMES[req.api_key]
            msg = f"{what} request received after successful authentication"
            log.info("client %s: %s (answered ILLEGAL_SASL_STATE)", self.peer, msg)
            return reply(sasl_error_body(req.api_key, req.api_version, Errors.ILLEGAL_SASL_STATE, msg))
        if req.api_key == SASL_HANDSHAKE:
            if self.state != "handshake":
                return Verdict("close", reason="a second SaslHandshake during authentication (illegal SASL state)")
            mech = str(req.body.mechanism)
            if mech not in self.auth.mechanisms:
                self._fail(f"unsupported mechanism {mech[:64]!r} (enabled: {', '.join(self.auth.mechanisms)})")
                return reply(sasl_error_body(req.api_key, req.api_version, Errors.UNSUPPORTED_SASL_MECHANISM,
                                             mechanisms=self.auth.mechanisms), close=True,
                             reason=f"unsupported SASL mechanism {mech[:64]!r}")
            creds = self.auth.store.current().with_internal(self.auth.internal_users)
            self.mechanism = server_mechanism(mech, creds)
            self.state = "authenticate"
            self.raw = req.api_version == 0
            return reply(sasl_error_body(req.api_key, req.api_version, Errors.NONE,
                                         mechanisms=self.auth.mechanisms))
        # SaslAuthenticate
        if self.state != "authenticate":
            return Verdict("close", reason="SaslAuthenticate before SaslHandshake (illegal SASL state)")
        try:
            out = await self._step(bytes(req.body.auth_bytes))
        except AuthenticationFailed as e:
            self._fail(str(e))
            return reply(sasl_error_body(req.api_key, req.api_version, Errors.SASL_AUTHENTICATION_FAILED, str(e)),
                         close=True, reason=str(e))
        cls = load_response_schema(req.api_key, req.api_version)
        return reply(cls(error_code=ErrorCode.none, error_message=None, auth_bytes=out))


async def linger_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float = 1.0) -> None:
    """After refusing a client: give it up to ``timeout`` to read the answer and hang up first.

    Closing a socket with unread input sends a reset, and a reset can destroy the answer still on
    its way (kafka-python then reports "socket disconnected" instead of the authentication error).
    So: stop writing, discard what the client still sends until it closes, then close.
    """
    try:
        if writer.can_write_eof():
            writer.write_eof()
        else:  # TLS cannot half-close: the client sees no end of stream until we close, so linger less
            timeout = min(timeout, 0.25)
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass


def api_versions_table(base: dict[int, tuple[int, int]], sasl: SaslAuthenticator | None) -> dict:
    """The ApiVersions table of a listener: its APIs, plus the SASL ones when SASL is on."""
    return base if sasl is None else {**base, **SASL_SUPPORTED}
