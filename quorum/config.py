"""Node configuration (TOML), validated with readable errors.

Example::

    node_id = 1
    data_dir = "/var/lib/pidquorum"
    secret_file = "/etc/pidquorum/secret"     # the cluster secret (pysyncobj password)
    raft_address = "10.0.0.1:9093"           # advertised to peers
    client_address = "10.0.0.1:9092"         # Kafka protocol for brokers and pidctl
    # raft_bind / client_bind default to the advertised addresses
    cluster_id = "c-0f6d..."                 # the same on every node (pidctl cluster new-id)
    block_size = 1000
    request_timeout_ms = 3000
    allocate_rate_per_broker = 1000.0        # blocks/s per broker; 0 = no limit
    allocate_burst = 2000
    max_frame_bytes = 1048576
    # Authentication (optional; see README "Security"): SASL on the client port,
    # optionally inside TLS; ACLs are enforced when SASL is on.
    sasl_credentials_file = "users.json"     # pidctl user add --file users.json ...
    sasl_mechanisms = ["PLAIN", "SCRAM-SHA-256"]
    super_users = ["User:admin"]              # may do anything (ACL bootstrap)
    tls_certfile = "node1.pem"                # TLS on the client port
    tls_keyfile = "node1.key"
    tls_cafile = "ca.pem"                     # the CA this node trusts: verifies the other nodes when
                                              # forwarding (default: the system's trust store)
    tls_client_auth = false                   # true: clients must present a certificate (mutual TLS)
    metrics_port = 9095                      # Prometheus /metrics on metrics_host (127.0.0.1); 0 = off
    log_format = "json"                      # default "human"

    [raft]                                  # seconds; see quorum.raft.RaftConfig
    election_timeout_min = 0.25

    [[peers]]
    node_id = 2
    raft_address = "10.0.0.2:9093"
    client_address = "10.0.0.2:9092"
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field

from .raft import RaftConfig


class ConfigError(ValueError):
    pass


@dataclass
class Peer:
    node_id: int
    raft_address: str
    client_address: str


@dataclass
class NodeConfig:
    node_id: int
    data_dir: str
    raft_address: str
    client_address: str
    secret: str
    peers: list[Peer] = field(default_factory=list)
    raft_bind: str | None = None
    client_bind: str | None = None
    block_size: int = 1000
    request_timeout_ms: int = 3000
    allocate_rate_per_broker: float = 1000.0
    allocate_burst: int = 2000
    max_frame_bytes: int = 1024 * 1024
    max_batch: int = 512
    # Leader-side reserve (0 = off): a broker allocating again within a second gets up to this many
    # blocks committed for it ahead of its requests, then answered without waiting for a commit.
    allocate_reserve_blocks: int = 0
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000   # Kafka's transactional.id.expiration.ms
    transaction_max_timeout_ms: int = 15 * 60 * 1000               # Kafka's transaction.max.timeout.ms
    sasl_credentials_file: str | None = None   # set: SASL required on the client port, ACLs enforced
    sasl_mechanisms: list[str] = field(default_factory=lambda: ["PLAIN", "SCRAM-SHA-256"])
    super_users: list[str] = field(default_factory=list)  # principals ACLs never refuse (Kafka's super.users)
    tls_certfile: str | None = None            # set: the client port speaks TLS
    tls_keyfile: str | None = None
    tls_cafile: str | None = None
    tls_client_auth: bool = False
    metrics_port: int = 0                  # Prometheus /metrics; 0 = off
    metrics_host: str = "127.0.0.1"
    log_format: str = "human"              # or "json": one JSON object per line
    cluster_id: str | None = None  # fixed at bootstrap (quorum.identity); default: derived from the secret
    raft: RaftConfig = field(default_factory=RaftConfig)

    def client_address_of(self, raft_address: str) -> str | None:
        if raft_address == self.raft_address:
            return self.client_address
        for peer in self.peers:
            if peer.raft_address == raft_address:
                return peer.client_address
        return None

    def validate(self) -> None:
        if not self.secret:
            raise ConfigError("the cluster secret is empty: a node never starts without one")
        for name in ("raft_address", "client_address"):
            _check_address(name, getattr(self, name))
        for peer in self.peers:
            _check_address(f"peers[{peer.node_id}].raft_address", peer.raft_address)
            _check_address(f"peers[{peer.node_id}].client_address", peer.client_address)
        ids = [self.node_id] + [p.node_id for p in self.peers]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"node ids must be unique, got {ids}")
        if not 1 <= self.block_size <= 2**31 - 1:
            raise ConfigError("block_size must be in 1..2147483647")
        if self.request_timeout_ms <= 0:
            raise ConfigError("request_timeout_ms must be positive")
        if self.allocate_rate_per_broker < 0 or self.allocate_burst < 1:
            raise ConfigError("allocate_rate_per_broker must be >= 0 and allocate_burst >= 1")
        if self.cluster_id is not None and (not isinstance(self.cluster_id, str) or not self.cluster_id.strip()):
            raise ConfigError("cluster_id must be a non-empty string")
        if not 0 <= self.allocate_reserve_blocks <= 1024:
            raise ConfigError("allocate_reserve_blocks must be in 0..1024")
        if self.max_frame_bytes < 1024:
            raise ConfigError("max_frame_bytes must be at least 1024")
        if self.transactional_id_expiration_ms <= 0 or not 0 < self.transaction_max_timeout_ms <= 2**31 - 1:
            raise ConfigError("transactional_id_expiration_ms and transaction_max_timeout_ms must be positive "
                              "(the timeout at most 2147483647)")
        if self.tls_keyfile and not self.tls_certfile:
            raise ConfigError("tls_keyfile is set but tls_certfile is not")
        if (self.tls_cafile or self.tls_client_auth) and not self.tls_certfile:
            raise ConfigError("tls_cafile / tls_client_auth are set but tls_certfile is not (TLS is off)")
        if self.tls_client_auth and not self.tls_cafile:
            raise ConfigError("tls_client_auth needs tls_cafile (the CA that signs client certificates)")
        for m in self.sasl_mechanisms:
            if m not in ("PLAIN", "SCRAM-SHA-256"):
                raise ConfigError(f"sasl_mechanisms: {m!r} is not PLAIN or SCRAM-SHA-256")
        if self.sasl_credentials_file is not None and not self.sasl_mechanisms:
            raise ConfigError("sasl_mechanisms must not be empty")
        for u in self.super_users:
            if not isinstance(u, str) or not u.startswith("User:") or len(u) <= 5:
                raise ConfigError(f"super_users: {u!r} is not User:<name>")
        if isinstance(self.metrics_port, bool) or not isinstance(self.metrics_port, int) \
                or not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics_port must be in 0..65535 (0 = off), got {self.metrics_port!r}")
        if self.log_format not in ("human", "json"):
            raise ConfigError(f"log_format must be \"human\" or \"json\", got {self.log_format!r}")
        try:
            self.raft.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _check_address(name: str, value: str) -> None:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name}: expected host:port, got {value!r}")


def load(path: str) -> NodeConfig:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return from_dict(raw, base_dir=os.path.dirname(os.path.abspath(path)))


def from_dict(raw: dict, base_dir: str = ".") -> NodeConfig:
    raw = dict(raw)
    try:
        secret_file = raw.pop("secret_file", None)
        secret = raw.pop("secret", None)
        if secret is None:
            if secret_file is None:
                raise ConfigError("secret_file is required: a node never starts without a cluster secret")
            path = os.path.join(base_dir, secret_file)
            try:
                with open(path) as f:
                    secret = f.read().strip()
            except OSError as e:
                raise ConfigError(f"secret_file {path}: {e.strerror}") from None
        peers = [Peer(int(p["node_id"]), str(p["raft_address"]), str(p["client_address"]))
                 for p in raw.pop("peers", [])]
        raft_raw = raw.pop("raft", {})
        raft_fields = {f.name for f in dataclasses.fields(RaftConfig)}
        unknown = set(raft_raw) - raft_fields
        if unknown:
            raise ConfigError(f"[raft]: unknown keys {sorted(unknown)}")
        node_fields = {f.name for f in dataclasses.fields(NodeConfig)} - {"secret", "peers", "raft"}
        unknown = set(raw) - node_fields
        if unknown:
            raise ConfigError(f"unknown keys {sorted(unknown)}")
        for key in ("node_id", "data_dir", "raft_address", "client_address"):
            if key not in raw:
                raise ConfigError(f"{key} is required")
        cfg = NodeConfig(secret=secret, peers=peers, raft=RaftConfig(**raft_raw), **raw)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"bad config: {e}") from None
    cfg.data_dir = os.path.join(base_dir, cfg.data_dir)
    for name in ("sasl_credentials_file", "tls_certfile", "tls_keyfile", "tls_cafile"):
        if getattr(cfg, name):
            setattr(cfg, name, os.path.join(base_dir, getattr(cfg, name)))
    cfg.validate()
    return cfg


def to_toml(cfg: NodeConfig, secret_file: str) -> str:
    """Render a config file (used by ``pidctl cluster up``).

    Every field is written (the secret as a reference to ``secret_file``), so
    ``load`` of the result gives back ``cfg``; an unset optional field (None)
    is left out, which is how the file says "unset".
    """
    node_fields = [f for f in dataclasses.fields(NodeConfig) if f.name not in ("secret", "peers", "raft")]
    lines = [f"secret_file = {_toml_value(secret_file)}"] + _toml_lines(cfg, node_fields)
    lines += ["", "[raft]"] + _toml_lines(cfg.raft, dataclasses.fields(RaftConfig))
    for peer in cfg.peers:
        lines += ["", "[[peers]]"] + _toml_lines(peer, dataclasses.fields(Peer))
    return "\n".join(lines) + "\n"


def _toml_lines(obj, fields) -> list[str]:
    lines = []
    for f in fields:
        value = getattr(obj, f.name)
        if value is None:
            continue
        if f.type == "float":  # keep a float a float in the file, even if given as an int
            value = float(value)
        lines.append(f"{f.name} = {_toml_value(value)}")
    return lines


def _toml_value(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)
