"""A broker's settings: ``BrokerConfig``, from a TOML file, flags, or both (flags override the file).

Each field is documented where it is declared; the annotated example is ``deploy/broker.toml``, and
how keys map to ``pidctl broker start`` flags is in docs/deployment.md, "3. The configs".
"""
from __future__ import annotations

import os
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from quorum import settings
from quorum.client.quorum import SettingNames
from quorum.security.client import ClientSecurity
from quorum.settings import PATH, BindAddress, HostPort, Table, UserPrincipal
from quorum.settings.flags import Flag

from .groups.membership import GroupSettings
from .pid_manager_config import DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS, QUORUM_BROKER_SESSION_TIMEOUT_MS, PidManagerConfig
from .quota import QuotaWindow

Mechanism = Literal["PLAIN", "SCRAM-SHA-256"]


# The settings a broker's errors about reaching the quorum name as the fix (a file's keys; each is also a
# --quorum-... flag).
QUORUM_SETTING_NAMES = SettingNames(tls='security_protocol = "SSL" in [quorum_security]',
                                    plaintext='security_protocol = "PLAINTEXT" in [quorum_security]',
                                    cafile="tls_cafile in [quorum_security]")


@settings.model
class QuorumSecurity:
    """How the broker reaches the quorum (Kafka's security.protocol and sasl.*): the file's
    ``[quorum_security]`` table and the ``--quorum-...`` flags; the broker holds its ``ClientSecurity``."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How to reach the quorum."""
    sasl_mechanism: Mechanism = "PLAIN"
    """The SASL mechanism towards the quorum."""
    sasl_username: Annotated[str | None, Flag(envvar="PIDQUORUM_BROKER_SASL_USERNAME")] = None
    """The broker's user on the quorum (needs CLUSTER_ACTION)."""
    sasl_password: Annotated[str | None, Flag(envvar="PIDQUORUM_BROKER_SASL_PASSWORD", secret=True)] = None
    """The broker's password on the quorum."""
    tls_cafile: Annotated[str | None, PATH] = None
    """CA of the quorum's certificates."""

    @model_validator(mode="after")
    def _check(self) -> "QuorumSecurity":
        if self.tls_cafile is not None and self.security_protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
            # Not ignored in silence: whoever set a CA meant TLS, and the broker would speak plaintext.
            tls = "SASL_SSL" if self.security_protocol == "SASL_PLAINTEXT" else "SSL"
            raise ValueError(f"tls_cafile is set but security_protocol is {self.security_protocol} (no TLS, the CA "
                             f"would not be used): set security_protocol = \"{tls}\", or remove tls_cafile")
        self.client_security()  # its ValueError names what is missing
        return self

    def client_security(self) -> ClientSecurity | None:
        """None for PLAINTEXT."""
        if self.security_protocol == "PLAINTEXT":
            return None
        return ClientSecurity(self.security_protocol, self.sasl_mechanism, self.sasl_username, self.sasl_password,
                              self.tls_cafile)


@settings.model
class BrokerConfig:
    broker_id: Annotated[int, Field(ge=0, le=2**31 - 1)]
    """This broker's id (Kafka's broker.id)."""
    quorum: Annotated[list[HostPort], Field(strict=False, min_length=1),
                      Flag(sep=",", metavar="HOST:PORT,...",
                           help="Quorum client addresses host:port,... (default: the local cluster's).")]
    """The quorum's client addresses (host:port)."""
    listen: BindAddress = "127.0.0.1:9092"
    """host:port to serve Kafka clients on."""
    data_dir: Annotated[str | None, PATH] = None
    """Where partitions live (default: .pidquorum-broker-<broker_id> in the working directory)."""
    advertised: HostPort | None = None
    """host:port put in Metadata (default: the listen address)."""
    cluster_id: str = "pidquorum"
    """The cluster id put in Metadata."""
    default_partitions: Annotated[int, Field(ge=1, le=10_000), Flag(name="--partitions")] = 1
    """Partitions of an auto-created topic."""
    auto_create_topics: bool = True
    """Create a topic a client produces to or asks for."""
    max_frame_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024
    """The largest request accepted."""
    max_connections: Annotated[int, Field(ge=1)] = 10_000
    """Kafka's max.connections: client connections at once; one more is closed at once (logged, counted)."""
    max_connections_per_ip: Annotated[int, Field(ge=1)] = 10_000
    """Kafka's max.connections.per.ip: connections from one address (lower it so one host cannot take them all)."""
    max_connection_buffer_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    """Requests read ahead on one connection, in bytes; past it that socket is not read (one frame always passes)."""
    max_unauthenticated_frame_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    """With SASL on: the largest frame before the connection has authenticated (ApiVersions, SaslHandshake,
    SaslAuthenticate are small; Kafka's sasl.server.max.receive.size); a bigger size closes the connection
    before its body is read.  At most ``max_frame_bytes``."""
    authentication_timeout_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 10_000
    """With SASL on: a connection not authenticated (TLS handshake and SASL exchange) this long after it was
    accepted is closed, however it trickles bytes (counted, logged at most every 10 s)."""
    tls_handshake_timeout_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 10_000
    """With TLS on: a connection whose TLS handshake has not completed this long after it was accepted is
    closed."""
    describe_producers_limit: Annotated[int, Field(ge=1)] = 1000
    """DescribeProducers: at most this many producers per partition, lowest ids first."""
    producer_id_expiration_ms: Annotated[int, Field(ge=1)] = 24 * 3600 * 1000
    """Kafka's producer.id.expiration.ms: an idle producer's state is dropped after this long."""
    max_producers_per_partition: Annotated[int | None, Field(ge=1)] = 2_000_000
    """Producers whose state a partition keeps (about 110 bytes each); past it the least recently used 1 % are
    evicted, and get UNKNOWN_PRODUCER_ID if they come back with the same epoch (Kafka has no cap)."""
    idempotence_retry_window_ms: Annotated[int, Field(ge=0)] = 300_000
    """How long after its last append a producer may still retry one of its 4 batches before the last
    (they are kept that long; above the clients' delivery.timeout.ms, 120 s by default)."""
    producer_snapshot_every: Annotated[int, Field(ge=1)] = 100_000
    """Appended batches between producer-state snapshots (also taken when a segment rolls and on close):
    after a crash a restart replays at most this many batch headers."""
    segment_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    """Size at which a partition's log rolls to a new segment."""
    retention_ms: Annotated[int | None, Field(ge=-1)] = 7 * 24 * 3600 * 1000
    """Kafka's log.retention.ms: a sealed segment is deleted once its newest record is this old (-1: never)."""
    retention_bytes: Annotated[int | None, Field(ge=-1)] = None
    """Kafka's log.retention.bytes: old segments are deleted while a partition's log is larger (-1 or unset: no
    limit)."""
    max_open_segments: Annotated[int, Field(ge=1)] = 1000
    """Segment files open at once, all partitions together (the least recently used are closed)."""
    max_topics: Annotated[int, Field(ge=1)] = 1000
    """Topics the broker holds; creating one more is refused (UNKNOWN_TOPIC_OR_PARTITION)."""
    group_min_session_timeout_ms: Annotated[int, Field(ge=1, le=3_600_000)] = 6_000
    """Kafka's group.min.session.timeout.ms: a JoinGroup asking for a shorter session gets INVALID_SESSION_TIMEOUT."""
    group_max_session_timeout_ms: Annotated[int, Field(ge=1, le=86_400_000)] = 1_800_000
    """Kafka's group.max.session.timeout.ms: a JoinGroup asking for a longer session gets INVALID_SESSION_TIMEOUT."""
    group_initial_rebalance_delay_ms: Annotated[int, Field(ge=0, le=600_000)] = 3_000
    """Kafka's group.initial.rebalance.delay.ms: an empty group's first rebalance waits this long for more
    members (and again while they keep coming, up to the rebalance timeout)."""
    group_max_size: Annotated[int, Field(ge=1)] = 10_000
    """Kafka's group.max.size: members of one group (Kafka has no bound by default); one more gets
    GROUP_MAX_SIZE_REACHED."""
    max_groups: Annotated[int, Field(ge=1)] = 100_000
    """Consumer groups this broker coordinates (a new one past it gets COORDINATOR_NOT_AVAILABLE; Kafka has no
    bound)."""
    offsets_retention_minutes: Annotated[int, Field(ge=1)] = 7 * 24 * 60
    """Kafka's offsets.retention.minutes: an empty group's committed offsets are kept this long after their
    commit and after the group became empty; then they expire, and the group with them."""
    offset_metadata_max_bytes: Annotated[int, Field(ge=0)] = 4096
    """Kafka's offset.metadata.max.bytes: a committed offset's metadata string, at most (else
    OFFSET_METADATA_TOO_LARGE for that partition)."""
    dedup: bool = True
    """Idempotence checks; off (--no-dedup) only to show what they prevent."""
    io_threads: Annotated[int, Field(ge=1)] = 4
    """Threads for the partitions' disk writes."""
    quorum_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """Deadline of one call to the quorum."""
    broker_heartbeat_interval_ms: Annotated[int, Field(ge=10, lt=QUORUM_BROKER_SESSION_TIMEOUT_MS)] = (
        DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS)
    """Kafka's broker.heartbeat.interval.ms (default 2000): how often the broker sends BrokerHeartbeat, which
    keeps its registration's session live so that no other incarnation can take its broker id.  Below the
    quorum's broker_session_timeout_ms (9000 by default; a quorum with a shorter one needs a shorter interval,
    a few heartbeats per session)."""
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Serve Prometheus metrics on this port (0 = off)."""
    metrics_host: str = "127.0.0.1"
    """Address the metrics port binds to."""
    log_format: Annotated[Literal["human", "json"], Flag(envvar="PIDQUORUM_LOG_FORMAT")] = "human"
    """Log lines as text or one JSON object per line."""
    pid_manager: Annotated[PidManagerConfig, Table()] = field(default_factory=PidManagerConfig)
    # KIP-936 producer-ID quota: producer.id.quota.window.num / .size.seconds; quotas come from the quorum
    producer_id_quota_window_num: Annotated[int, Field(ge=1, le=1000)] = 11
    """KIP-936 producer.id.quota.window.num: windows a producer ID is remembered."""
    producer_id_quota_window_size_s: Annotated[float, Field(gt=0, le=7 * 86400)] = 3600.0
    """KIP-936 producer.id.quota.window.size.seconds."""
    producer_id_quota_false_positive_rate: Annotated[float, Field(gt=0, lt=0.5)] = 0.001
    """Target chance that a never-seen producer ID passes the quota for free."""
    producer_id_quota_burst_s: Annotated[float, Field(gt=0, le=7 * 86400)] = 60.0
    """New producer IDs a principal may start at once, in seconds of its producer_ids_rate (at most the window)."""
    quota_refresh_s: Annotated[float, Field(gt=0, le=3600)] = 1.0
    """How often the client quotas are read from the quorum."""
    # Security (README "Security").  sasl_credentials_file set: SASL is required on the listener and
    # InitProducerId / the transactional requests are authorized with the quorum's ACLs.
    sasl_credentials_file: Annotated[str | None, PATH] = None
    """Require SASL (PLAIN, SCRAM-SHA-256) from clients, with these users; ACLs are then enforced."""
    sasl_mechanisms: Annotated[tuple[Mechanism, ...], Field(strict=False),
                               Flag(name="--sasl-mechanism", help="Enabled mechanisms (repeat; default: both).")] = (
        "PLAIN", "SCRAM-SHA-256")
    """Enabled SASL mechanisms."""
    super_users: Annotated[tuple[UserPrincipal, ...], Field(strict=False), Flag(name="--super-user")] = ()
    """User:<name> the ACLs never refuse (Kafka's super.users; the flag: repeat)."""
    acl_refresh_s: Annotated[float, Field(ge=0.01), Flag(name="--acl-refresh-ms", scale=1000)] = 1.0
    """How often the ACLs are read from the quorum (the flag: in milliseconds)."""
    tls_certfile: Annotated[str | None, PATH] = None
    """Serve TLS with this certificate (chain)."""
    tls_keyfile: Annotated[str | None, PATH] = None
    """The certificate's private key (default: in tls_certfile)."""
    tls_cafile: Annotated[str | None, PATH] = None
    """CA of client certificates (tls_client_auth)."""
    tls_client_auth: bool = False
    """Require client certificates (mutual TLS)."""
    quorum_security: Annotated[Any, Table(QuorumSecurity, QuorumSecurity.client_security),
                               Flag(prefix="quorum-")] = None
    """How to reach the quorum: a ``quorum.security.client.ClientSecurity``, None for PLAINTEXT; in a file, the
    ``[quorum_security]`` table."""

    @model_validator(mode="after")
    def _check(self) -> "BrokerConfig":
        if (self.tls_keyfile or self.tls_cafile or self.tls_client_auth) and not self.tls_certfile:
            raise ValueError("tls_keyfile / tls_cafile / tls_client_auth need tls_certfile")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("group_min_session_timeout_ms must not be above group_max_session_timeout_ms")
        if self.sasl_credentials_file is not None and not self.sasl_mechanisms:
            raise ValueError("sasl_mechanisms must not be empty")
        if isinstance(self.quorum_security, (str, int, float, list)):  # Any, for a ClientSecurity-like object
            raise ValueError(f"quorum_security: expected a table, got {self.quorum_security!r}")
        if self.data_dir is None:
            self.data_dir = f".pidquorum-broker-{self.broker_id}"
        return self

    @property
    def group_settings(self) -> GroupSettings:
        return GroupSettings(self.group_min_session_timeout_ms, self.group_max_session_timeout_ms,
                             self.group_initial_rebalance_delay_ms, self.group_max_size,
                             self.offset_metadata_max_bytes, self.max_groups,
                             self.offsets_retention_minutes * 60_000)

    @property
    def quota_window(self) -> QuotaWindow:
        return QuotaWindow(num=self.producer_id_quota_window_num, size_s=float(self.producer_id_quota_window_size_s),
                           false_positive_rate=float(self.producer_id_quota_false_positive_rate),
                           burst_s=float(self.producer_id_quota_burst_s))

    @property
    def advertised_address(self) -> tuple[str, int]:
        host, port = (self.advertised or self.listen).rsplit(":", 1)
        return host, int(port)

    def with_bound_port(self, port: int) -> None:
        """After binding ``host:0``: advertise the port the system picked."""
        host, listen_port = self.listen.rsplit(":", 1)
        if int(listen_port) == 0:
            self.listen = f"{host}:{port}"


def load(path: str | None = None, flags: dict | None = None, quorum: Any = None) -> BrokerConfig:
    """The settings of the TOML file at ``path`` (if any; relative paths in it are relative to its
    directory), with ``flags`` (``quorum.settings.flags.given``) in place of the file's, and the defaults for
    the rest; ``quorum()``: the quorum's addresses if neither gives them.  A bad file or setting raises
    ``ConfigError`` naming the file, the key and the problem."""
    raw = {}
    if path:
        raw = settings.resolve_paths(BrokerConfig, settings.read(path), os.path.dirname(os.path.abspath(path)))
    raw = settings.merge(raw, flags or {})
    if "quorum" not in raw and quorum is not None:
        raw["quorum"] = quorum()
    return settings.build(BrokerConfig, raw, source=path)

