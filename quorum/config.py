"""Node configuration (TOML), validated with readable errors.  ``docs/operations.md`` has an annotated
example of every setting.
"""
from __future__ import annotations

import logging
import os
import stat
from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from quorum import settings
from quorum.settings import PATH, ConfigError, HostPort, Table, UserPrincipal

from .managers import DEFAULT_BROKER_SESSION_TIMEOUT_MS
from .raft import RaftConfig

log = logging.getLogger(__name__)

__all__ = ["ConfigError", "NodeConfig", "Peer", "from_dict", "load", "to_toml"]

Mechanism = Literal["PLAIN", "SCRAM-SHA-256"]


@settings.model
class Peer:
    node_id: int
    raft_address: HostPort
    client_address: HostPort


@settings.model
class NodeConfig:
    node_id: int
    data_dir: Annotated[str, PATH]
    raft_address: HostPort
    client_address: HostPort
    secret: str
    peers: Annotated[list[Annotated[Peer, Table()]], Field(strict=False)] = field(default_factory=list)
    raft_bind: str | None = None
    client_bind: str | None = None
    block_size: Annotated[int, Field(ge=1, le=2**31 - 1)] = 1000
    request_timeout_ms: Annotated[int, Field(gt=0)] = 3000
    allocate_rate_per_broker: Annotated[float, Field(ge=0)] = 1000.0
    """Blocks/s per broker; 0 = no limit."""
    allocate_burst: Annotated[int, Field(ge=1)] = 2000
    max_frame_bytes: Annotated[int, Field(ge=1024)] = 1024 * 1024
    """The largest request accepted on the client port."""
    max_connections: Annotated[int, Field(ge=1)] = 1000
    """Client-port connections at once (Kafka's max.connections), counted from the accept, before TLS; one
    more is closed at once (counted in ``connections_refused``, logged at most every 10 s)."""
    max_connections_per_ip: Annotated[int, Field(ge=1)] = 1000
    """Client-port connections from one address (Kafka's max.connections.per.ip); lower it so one host
    cannot take them all (the nodes' forwarding connections count too: one per follower)."""
    max_connection_buffer_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    """Requests read from one connection and not answered yet, in bytes; past it that socket is not read
    until answers catch up (one frame always passes)."""
    max_unauthenticated_frame_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    """With SASL on: the largest frame before the connection has authenticated (ApiVersions, SaslHandshake,
    SaslAuthenticate are small); a bigger one closes the connection.  At most ``max_frame_bytes``."""
    authentication_timeout_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 10_000
    """With SASL on: a connection not authenticated (TLS handshake and SASL exchange) this long after it
    was accepted is closed, however it trickles bytes."""
    tls_handshake_timeout_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 10_000
    """With TLS on: a connection whose TLS handshake has not completed this long after it was accepted is
    closed."""
    max_batch: int = 512
    allocate_reserve_blocks: Annotated[int, Field(ge=0, le=1024)] = 0
    """Leader-side reserve (0 = off): a broker allocating again within a second gets up to this many
    blocks committed for it ahead of its requests, then answered without waiting for a commit."""
    transactional_id_expiration_ms: Annotated[int, Field(gt=0)] = 7 * 24 * 3600 * 1000
    """Kafka's transactional.id.expiration.ms."""
    transaction_max_timeout_ms: Annotated[int, Field(gt=0, le=2**31 - 1)] = 15 * 60 * 1000
    """Kafka's transaction.max.timeout.ms."""
    broker_session_timeout_ms: Annotated[int, Field(ge=100, le=3_600_000)] = DEFAULT_BROKER_SESSION_TIMEOUT_MS
    """Kafka's broker.session.timeout.ms: a broker registration whose broker heartbeated within this long is
    live, and a BrokerRegistration of its id by another incarnation is refused (DUPLICATE_BROKER_REGISTRATION)
    until it lapses.  Keep it above the brokers' ``broker_heartbeat_interval_ms`` (2000 by default); every node
    should have the same value (the leader's decides)."""
    sasl_credentials_file: Annotated[str | None, PATH] = None
    """Set: SASL required on the client port, ACLs enforced."""
    sasl_mechanisms: Annotated[list[Mechanism], Field(strict=False)] = field(
        default_factory=lambda: ["PLAIN", "SCRAM-SHA-256"])
    super_users: Annotated[list[UserPrincipal], Field(strict=False)] = field(default_factory=list)
    """Principals ACLs never refuse (Kafka's super.users)."""
    tls_certfile: Annotated[str | None, PATH] = None
    """Set: the client port speaks TLS."""
    tls_keyfile: Annotated[str | None, PATH] = None
    tls_cafile: Annotated[str | None, PATH] = None
    tls_client_auth: bool = False
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Prometheus /metrics; 0 = off."""
    metrics_host: str = "127.0.0.1"
    log_format: Literal["human", "json"] = "human"
    """Or "json": one JSON object per line."""
    cluster_id: str | None = None
    """Fixed at bootstrap (quorum.identity); default: derived from the secret."""
    raft: Annotated[RaftConfig, Table()] = field(default_factory=RaftConfig)

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str) -> str:
        if not value:
            raise ValueError("the cluster secret is empty: a node never starts without one")
        return value

    @field_validator("cluster_id")
    @classmethod
    def _cluster_id(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a non-empty string")
        return value

    @model_validator(mode="after")
    def _check(self) -> "NodeConfig":
        ids = [self.node_id] + [p.node_id for p in self.peers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids must be unique, got {ids}")
        if self.tls_keyfile and not self.tls_certfile:
            raise ValueError("tls_keyfile is set but tls_certfile is not")
        if (self.tls_cafile or self.tls_client_auth) and not self.tls_certfile:
            raise ValueError("tls_cafile / tls_client_auth are set but tls_certfile is not (TLS is off)")
        if self.tls_client_auth and not self.tls_cafile:
            raise ValueError("tls_client_auth needs tls_cafile (the CA that signs client certificates)")
        if self.sasl_credentials_file is not None and not self.sasl_mechanisms:
            raise ValueError("sasl_mechanisms must not be empty")
        return self

    def client_address_of(self, raft_address: str) -> str | None:
        if raft_address == self.raft_address:
            return self.client_address
        for peer in self.peers:
            if peer.raft_address == raft_address:
                return peer.client_address
        return None

    def validate(self) -> None:
        """Check again (after an attribute was assigned; construction checks already)."""
        settings.revalidate(self)


def load(path: str) -> NodeConfig:
    raw = settings.read(path)
    try:
        return from_dict(raw, base_dir=os.path.dirname(os.path.abspath(path)))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def from_dict(raw: dict, base_dir: str = ".") -> NodeConfig:
    """A node's settings from a file's tables; relative paths (and ``secret_file``) are relative to ``base_dir``."""
    raw = dict(raw)
    secret_file = raw.pop("secret_file", None)
    if "secret" not in raw:
        if secret_file is None:
            raise ConfigError("secret_file is required: a node never starts without a cluster secret")
        if not isinstance(secret_file, str):
            raise ConfigError(f"secret_file: expected a file name, got {secret_file!r}")
        path = os.path.join(base_dir, secret_file)
        try:
            with open(path) as f:
                mode = os.fstat(f.fileno()).st_mode
                raw["secret"] = f.read().strip()
        except OSError as e:
            raise ConfigError(f"secret_file {path}: {e.strerror}") from None
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            log.warning("secret_file %s has mode %04o: group or others may read the cluster secret (chmod 600 %s)",
                        path, stat.S_IMODE(mode), path)
    return settings.build(NodeConfig, settings.resolve_paths(NodeConfig, raw, base_dir))


def to_toml(cfg: NodeConfig, secret_file: str) -> str:
    """Render a config file (used by ``pidctl cluster up``).

    Every field is written (the secret as a reference to ``secret_file``), so
    ``load`` of the result gives back ``cfg``; an unset optional field (None)
    is left out, which is how the file says "unset".
    """
    return settings.to_toml(cfg, first={"secret_file": secret_file}, exclude=("secret",))
