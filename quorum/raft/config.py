"""Raft's settings (``[raft]`` in a node's configuration) and the two outcomes of a proposal."""
from __future__ import annotations

from pydantic import model_validator

from quorum import settings
from ..raftlink import LinkLimits


@settings.model
class RaftConfig:
    """Raft timing, in seconds, snake_case; mapped to pysyncobj's names in ``RaftNode`` only."""

    heartbeat_interval: float = 0.05
    election_timeout_min: float = 0.25
    election_timeout_max: float = 0.5
    connection_timeout: float = 1.0
    reconnect_interval: float = 0.1
    peer_ping_interval: float = 0.15
    leader_step_down_timeout: float = 1.0
    compaction_min_entries: int = 5000
    compaction_min_time: float = 300.0
    snapshot_chunk_bytes: int = 65536  # an InstallSnapshot message carries at most this much of the snapshot
    append_entries_batch_bytes: int = 65536  # an AppendEntries carries entries up to about this much (one at least)
    # The Raft port (quorum.raftlink): what a connection may cost before and after it proves the cluster secret.
    max_message_bytes: int = 32 * 2**20  # one message from a peer that proved the secret
    handshake_bytes: int = 4096  # one message before that
    handshake_timeout: float = 2.0  # from a connection's opening to its proof of the secret
    max_pending_connections: int = 64  # unauthenticated incoming connections at once (the oldest over it closed)
    max_pending_per_host: int = 8  # ... from one peer host
    listen_backlog: int = 1024
    accept_rate: float = 200.0  # new connections taken per second, in bursts of accept_burst (the rest queue)
    accept_burst: int = 64

    @model_validator(mode="after")
    def _check(self) -> "RaftConfig":
        problems = []
        if self.heartbeat_interval <= 0:
            problems.append("heartbeat_interval must be positive")
        if self.election_timeout_min <= 3 * self.heartbeat_interval:
            problems.append(f"election_timeout_min ({self.election_timeout_min}) must exceed 3 x "
                            f"heartbeat_interval ({self.heartbeat_interval})")
        if self.election_timeout_max <= self.election_timeout_min:
            problems.append("election_timeout_max must exceed election_timeout_min")
        if self.connection_timeout < self.election_timeout_max:
            problems.append("connection_timeout must be at least election_timeout_max")
        if self.peer_ping_interval >= self.connection_timeout / 2:
            problems.append("peer_ping_interval must be under half of connection_timeout")
        if self.leader_step_down_timeout <= self.heartbeat_interval:
            problems.append("leader_step_down_timeout must exceed heartbeat_interval")
        if self.compaction_min_entries < 2:
            problems.append("compaction_min_entries must be at least 2")
        if not 64 <= self.snapshot_chunk_bytes <= 64 * 2**20:
            problems.append("snapshot_chunk_bytes must be between 64 and 64 MiB")
        if not 64 <= self.append_entries_batch_bytes <= 64 * 2**20:
            problems.append("append_entries_batch_bytes must be between 64 and 64 MiB")
        if not 2**20 <= self.max_message_bytes <= 2**31 - 1:
            problems.append("max_message_bytes must be between 1 MiB and 2 GiB")
        elif self.max_message_bytes < 4 * self.snapshot_chunk_bytes:
            problems.append("max_message_bytes must be at least 4 x snapshot_chunk_bytes")
        if not 512 <= self.handshake_bytes <= 65536:
            problems.append("handshake_bytes must be between 512 and 65536")
        if not 0 < self.handshake_timeout <= 60:
            problems.append("handshake_timeout must be above 0 and at most 60 s")
        if not 1 <= self.max_pending_per_host <= self.max_pending_connections <= 65536:
            problems.append("need 1 <= max_pending_per_host <= max_pending_connections <= 65536")
        if not 1 <= self.listen_backlog <= 65535:
            problems.append("listen_backlog must be between 1 and 65535")
        if not 1 <= self.accept_rate <= 1e6:
            problems.append("accept_rate must be between 1 and 1,000,000 a second")
        if not 1 <= self.accept_burst <= 65535:
            problems.append("accept_burst must be between 1 and 65535")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def link_limits(self) -> LinkLimits:
        return LinkLimits(max_message_bytes=self.max_message_bytes, handshake_bytes=self.handshake_bytes,
                          handshake_timeout=self.handshake_timeout, max_pending=self.max_pending_connections,
                          max_pending_per_host=self.max_pending_per_host, listen_backlog=self.listen_backlog,
                          accept_rate=self.accept_rate, accept_burst=self.accept_burst)

    def validate(self) -> None:
        """Check again (after an attribute was assigned; construction checks already)."""
        try:
            settings.revalidate(self)
        except ValueError as e:
            raise ValueError(f"raft config: {e}") from None


class ProposalRejected(Exception):
    """The entry was definitely not applied (not leader, queue full, ...): safe to retry."""


class ProposalUnknown(Exception):
    """The entry may or may not be applied (leader change, timeout): never reuse its values."""

