"""The client side: how a QuorumClient (brokers, pidctl, the nodes' forwards) connects.

``ClientSecurity`` mirrors Kafka's client settings: ``security.protocol``
(PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl.mechanism`` (PLAIN or
SCRAM-SHA-256), user name and password, and the CA file that verifies the
server's certificate.  ``authenticate`` runs the SASL exchange on a fresh
connection (SaslHandshake v1, then SaslAuthenticate v2) before any request.
"""
from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

from records.wire import kafka
from records.wire.errors import Errors, for_code

from .mechanisms import MECHANISMS, PLAIN, AuthenticationFailed, ScramClient
from .tls import client_context

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str = PLAIN
    username: str | None = None
    password: str | None = None
    cafile: str | None = None
    certfile: str | None = None  # a client certificate, for servers that require one (mutual TLS)
    keyfile: str | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"security protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.sasl:
            if self.mechanism not in MECHANISMS:
                raise ValueError(f"SASL mechanism {self.mechanism!r} is not one of {', '.join(MECHANISMS)}")
            if not self.username or self.password is None:
                raise ValueError(f"{self.protocol} needs a SASL user name and password")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        return client_context(self.cafile, self.certfile, self.keyfile, self.check_hostname)

    def __repr__(self) -> str:  # never print the password
        return (f"ClientSecurity(protocol={self.protocol!r}, mechanism={self.mechanism!r}, "
                f"username={self.username!r}, cafile={self.cafile!r})")


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: Any, corr: int,
                     client_id: str) -> Any:
    writer.write(kafka.encode_request(body, corr, client_id))
    await writer.drain()
    frame = await kafka.read_frame(reader, kafka.DEFAULT_MAX_FRAME)
    if frame is None:
        raise ConnectionError("the server closed the connection during SASL authentication")
    got, resp = kafka.parse_response(frame, body.__api_key__, body.__version__)
    if got != corr:
        raise ConnectionError(f"SASL response for correlation id {got}, expected {corr}")
    return resp


def _check(resp: Any, what: str) -> None:
    code = Errors.of(int(resp.error_code))
    if code != Errors.NONE:
        message = getattr(resp, "error_message", None)
        if code == Errors.UNSUPPORTED_SASL_MECHANISM:
            message = f"enabled mechanisms: {', '.join(resp.mechanisms) or 'none'}"
        raise for_code(code, f"{what}: {code.name}" + (f": {message}" if message else ""))


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sec: ClientSecurity,
                       client_id: str, address: str) -> None:
    """Raises SaslAuthenticationFailedError / UnsupportedSaslMechanismError (not retriable) or ConnectionError."""
    hs = kafka.request_entity(17, 1, mechanism=sec.mechanism)
    _check(await _roundtrip(reader, writer, hs, 1, client_id), f"{address}: SaslHandshake")

    async def send(token: bytes, corr: int) -> bytes:
        resp = await _roundtrip(reader, writer, kafka.request_entity(36, 2, auth_bytes=token), corr, client_id)
        _check(resp, f"{address}: SASL {sec.mechanism} as {sec.username!r}")
        return bytes(resp.auth_bytes)

    if sec.mechanism == PLAIN:
        await send(b"\0" + sec.username.encode() + b"\0" + sec.password.encode(), 2)
        return
    scram = ScramClient(sec.username, sec.password)
    server_first = await send(scram.first(), 2)
    try:
        final = scram.final(server_first)
    except (AuthenticationFailed, KeyError, ValueError) as e:
        raise for_code(Errors.SASL_AUTHENTICATION_FAILED, f"{address}: bad SCRAM server-first message: {e}") from None
    server_final = await send(final, 3)
    try:
        scram.verify(server_final)
    except AuthenticationFailed as e:
        raise for_code(Errors.SASL_AUTHENTICATION_FAILED, f"{address}: {e}") from None


__all__ = ["ClientSecurity", "PROTOCOLS", "authenticate"]
