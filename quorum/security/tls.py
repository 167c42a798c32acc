"""TLS contexts (Python's ssl module) for the two servers and for clients.

A server's ``tls_cafile`` is the CA it trusts; with ``tls_client_auth`` clients
must present a certificate signed by it (mutual TLS).  A client verifies the
server against its own ``cafile`` (or the system's trust store) and checks the
host name / IP.
"""
from __future__ import annotations

import functools
import os
import ssl


class TlsConfigError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file."""


def _load(action, what: str, *paths: str | None):
    try:
        return action()
    except (OSError, ssl.SSLError) as e:
        names = ", ".join(p for p in paths if p)
        raise TlsConfigError(f"{what} ({names}): {getattr(e, 'strerror', None) or e}") from None


def server_context(certfile: str, keyfile: str | None = None, cafile: str | None = None,
                   client_auth: bool = False) -> ssl.SSLContext:
    if not certfile:
        raise TlsConfigError("TLS needs a certificate file (tls_certfile)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(lambda: ctx.load_cert_chain(certfile, keyfile), "cannot load the TLS certificate/key", certfile, keyfile)
    if cafile:
        _load(lambda: ctx.load_verify_locations(cafile), "cannot load the TLS CA file", cafile)
    if client_auth:
        if not cafile:
            raise TlsConfigError("tls_client_auth needs tls_cafile (the CA that signs client certificates)")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A context that trusts ``cafile`` only, or the system's store without one.  Cached per files
    (and their modification times): building one with the system store takes tens of milliseconds."""
    stamps = tuple(_mtime(f) for f in (cafile, certfile, keyfile))
    return _client_context(cafile, certfile, keyfile, check_hostname, stamps)


def _mtime(path: str | None) -> int | None:
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None


@functools.lru_cache(maxsize=16)
def _client_context(cafile, certfile, keyfile, check_hostname, _stamps) -> ssl.SSLContext:
    if cafile:
        ctx = _load(lambda: ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile),
                    "cannot load the TLS CA file", cafile)
    else:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile:
        _load(lambda: ctx.load_cert_chain(certfile, keyfile), "cannot load the TLS client certificate/key",
              certfile, keyfile)
    ctx.check_hostname = check_hostname
    return ctx
