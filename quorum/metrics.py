"""The Prometheus metric families of a quorum node, read from ``QuorumServer.status()``
(the endpoint itself is ``quorum.telemetry.metrics``).  Metric names: ``QUORUM_METRICS``.
"""
from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from .stats import MAX_BROKER_COUNTERS, OTHER_BROKERS

RAFT_STATES = ("follower", "candidate", "leader")

# name -> help; the collector emits exactly these (the tests check the list).
QUORUM_METRICS = {
    "pidquorum_node": "This node's identity (node_id, raft and client address).",
    "pidquorum_raft_state": "1 for the node's current Raft state, 0 for the others.",
    "pidquorum_raft_term": "Current Raft term.",
    "pidquorum_raft_commit_index": "Raft commit index known to this node.",
    "pidquorum_raft_last_applied_index": "Last log index applied to the state machine here.",
    "pidquorum_raft_apply_lag_entries": "Committed entries not yet applied on this node.",
    "pidquorum_raft_follower_lag_entries": "On the leader: committed entries a follower does not hold yet.",
    "pidquorum_raft_follower_connected": "On any node: 1 if the link to that peer is up.",
    "pidquorum_raft_has_quorum": "1 if this node is a leader that has a quorum (pysyncobj's view).",
    "pidquorum_raft_recovering": "1 while this node may have lost entries it acknowledged (a restored backup, a "
                                 "journal cut by a fault), or after a start until enough peers vouched for it: it "
                                 "does not stand or count toward a majority (and votes only for a candidate that "
                                 "holds what it may have lost) until its log is back where it was.",
    "pidquorum_raft_leader_changes": "Times this node saw a new leader since it started.",
    "pidquorum_raft_journal_entries": "Entries in the Raft journal (since the last snapshot).",
    "pidquorum_journal_syncs": "fdatasync calls on the Raft journal.",
    "pidquorum_journal_sync_latency_seconds": "Write + fdatasync of the Raft journal, per sync.",
    "pidquorum_snapshot_size_bytes": "Size of the Raft snapshot file (0: none yet).",
    "pidquorum_snapshot_age_seconds": "Seconds since the snapshot file was written (absent: none yet).",
    "pidquorum_next_producer_id": "The quorum's next producer ID (applied state on this node).",
    "pidquorum_registered_brokers": "Broker registrations in the applied state.",
    "pidquorum_allocations": "Producer-ID blocks committed per broker (applied by this process); broker_id "
                             f"\"{OTHER_BROKERS}\": brokers past the first {MAX_BROKER_COUNTERS}, and unregistered "
                             "ones folded to make room.",
    "pidquorum_allocated_ids": f"Producer IDs committed per broker (applied by this process); broker_id "
                               f"\"{OTHER_BROKERS}\" as for pidquorum_allocations.",
    "pidquorum_allocation_latency_seconds": "AllocateProducerIds answered OK by this node, request to answer.",
    "pidquorum_requests": "Requests read on the client port.",
    "pidquorum_forwarded_requests": "Requests this follower forwarded to the leader.",
    "pidquorum_throttled_requests": "AllocateProducerIds answered THROTTLING_QUOTA_EXCEEDED.",
    "pidquorum_bad_frames": "Frames that closed the connection: unreadable, oversized, or an unknown API key.",
    "pidquorum_bad_requests":
        "Requests with a bad header or body, or ApiVersions at an unsupported version (answered with an error).",
    "pidquorum_unsupported_versions":
        "Requests at a version the server does not serve, ApiVersions excepted (connection closed, as Kafka does).",
    "pidquorum_raft_port_accepted_connections": "Connections the Raft port accepted.",
    "pidquorum_raft_port_accept_pauses":
        "Times the Raft port stopped accepting for a while: over accept_rate new connections a second.",
    "pidquorum_raft_port_refused_messages":
        "Raft connections closed for what they sent: a message over its size limit (handshake_bytes before the "
        "peer proved the cluster secret, max_message_bytes after), failing the secret's check, or unreadable.",
    "pidquorum_raft_port_evicted_connections":
        "Unauthenticated Raft connections closed, the oldest first, over max_pending_connections or "
        "max_pending_per_host.",
    "pidquorum_raft_port_expired_connections":
        "Raft connections closed for not proving the cluster secret within handshake_timeout, or for reading "
        "nothing for connection_timeout.",
    "pidquorum_client_connections": "Client-port connections open (counted from the accept, before TLS).",
    "pidquorum_client_connections_refused":
        "Client-port connections closed at once: over max_connections or max_connections_per_ip.",
    "pidquorum_client_authentication_timeouts":
        "Client-port connections closed for not completing TLS (tls_handshake_timeout_ms) or SASL "
        "(authentication_timeout_ms) in time.",
    "pidquorum_client_tls_handshake_failures": "Client-port TLS handshakes that failed (other than by timing out).",
    "pidquorum_client_read_pauses":
        "Times a client connection's socket was left unread: max_connection_buffer_bytes of requests unanswered.",
    "pidquorum_proposer_batches": "Log entries the proposer committed as leader.",
    "pidquorum_proposer_records": "Records in those entries.",
}


def histogram_family(name: str, doc: str, snap: dict, labels: dict[str, str] | None = None) -> HistogramMetricFamily:
    """A ``quorum.stats.Histogram.snapshot()`` as a Prometheus histogram."""
    fam = HistogramMetricFamily(name, doc, labels=list(labels or {}))
    buckets = [(("+Inf" if b == "+Inf" else repr(float(b))), c) for b, c in snap["buckets"]]
    fam.add_metric(list((labels or {}).values()), buckets, snap["sum_s"])
    return fam


def _counter(name: str, value: float, labels: dict[str, str] | None = None) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, QUORUM_METRICS.get(name, ""), labels=list(labels or {}))
    fam.add_metric(list((labels or {}).values()), value)
    return fam


def _gauge(name: str, value: float, doc: str | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc if doc is not None else QUORUM_METRICS.get(name, ""), value=value)


def quorum_families(st: dict) -> Iterable[Any]:
    """The metric families of one ``QuorumServer.status()`` dict."""
    raft = st["raft"]
    yield InfoMetricFamily("pidquorum_node", QUORUM_METRICS["pidquorum_node"],
                           value={"node_id": str(st["node_id"]), "raft_address": str(raft["self"]),
                                  "client_address": str(st["client_address"])})
    state = GaugeMetricFamily("pidquorum_raft_state", QUORUM_METRICS["pidquorum_raft_state"], labels=["state"])
    for s in RAFT_STATES:
        state.add_metric([s], 1.0 if raft["state"] == s else 0.0)
    yield state
    yield _gauge("pidquorum_raft_term", raft["term"])
    yield _gauge("pidquorum_raft_commit_index", raft["commit_index"])
    yield _gauge("pidquorum_raft_last_applied_index", raft["last_applied"])
    yield _gauge("pidquorum_raft_apply_lag_entries", max(0, raft["commit_index"] - raft["last_applied"]))
    lag = GaugeMetricFamily("pidquorum_raft_follower_lag_entries",
                            QUORUM_METRICS["pidquorum_raft_follower_lag_entries"], labels=["peer"])
    conn = GaugeMetricFamily("pidquorum_raft_follower_connected",
                             QUORUM_METRICS["pidquorum_raft_follower_connected"], labels=["peer"])
    for peer, p in sorted(raft["peers"].items()):
        if p.get("lag_entries") is not None:
            lag.add_metric([peer], p["lag_entries"])
        conn.add_metric([peer], 1.0 if p["connected"] else 0.0)
    yield lag
    yield conn
    yield _gauge("pidquorum_raft_has_quorum", 1.0 if raft["has_quorum"] else 0.0)
    yield _gauge("pidquorum_raft_recovering", 1.0 if raft.get("recovering") else 0.0)
    yield _counter("pidquorum_raft_leader_changes", raft["leader_changes"])
    port = raft.get("raft_port", {})
    yield _counter("pidquorum_raft_port_accepted_connections", port.get("accepted", 0))
    yield _counter("pidquorum_raft_port_accept_pauses", port.get("accept_pauses", 0))
    yield _counter("pidquorum_raft_port_refused_messages", port.get("refused_messages", 0))
    yield _counter("pidquorum_raft_port_evicted_connections", port.get("refused_pending", 0))
    yield _counter("pidquorum_raft_port_expired_connections", port.get("expired", 0))
    yield _gauge("pidquorum_raft_journal_entries", st["journal_entries"])
    yield _counter("pidquorum_journal_syncs", raft["journal_syncs"])
    yield histogram_family("pidquorum_journal_sync_latency_seconds",
                           QUORUM_METRICS["pidquorum_journal_sync_latency_seconds"], raft["journal_sync_latency"])
    snap = st["snapshot"]
    yield _gauge("pidquorum_snapshot_size_bytes", snap["bytes"])
    age = GaugeMetricFamily("pidquorum_snapshot_age_seconds", QUORUM_METRICS["pidquorum_snapshot_age_seconds"])
    if snap.get("age_s") is not None:
        age.add_metric([], snap["age_s"])
    yield age
    yield _gauge("pidquorum_next_producer_id", st["state"]["next_producer_id"])
    yield _gauge("pidquorum_registered_brokers", len(st["state"]["brokers"]))
    blocks = CounterMetricFamily("pidquorum_allocations", QUORUM_METRICS["pidquorum_allocations"],
                                 labels=["broker_id"])
    ids = CounterMetricFamily("pidquorum_allocated_ids", QUORUM_METRICS["pidquorum_allocated_ids"],
                              labels=["broker_id"])
    for broker, a in st["allocations"].items():
        blocks.add_metric([str(broker)], a["blocks"])
        ids.add_metric([str(broker)], a["ids"])
    yield blocks
    yield ids
    yield histogram_family("pidquorum_allocation_latency_seconds",
                           QUORUM_METRICS["pidquorum_allocation_latency_seconds"], st["allocate_latency"])
    server = st["server"]
    yield _counter("pidquorum_requests", server["requests"])
    yield _counter("pidquorum_forwarded_requests", server["forwarded"])
    yield _counter("pidquorum_throttled_requests", server["throttled"])
    yield _counter("pidquorum_bad_frames", server["bad_frames"])
    yield _counter("pidquorum_bad_requests", server["bad_requests"])
    yield _counter("pidquorum_unsupported_versions", server["unsupported_versions"])
    yield _gauge("pidquorum_client_connections", server.get("connections", 0))
    yield _counter("pidquorum_client_connections_refused", server.get("connections_refused", 0))
    yield _counter("pidquorum_client_authentication_timeouts", server.get("authentication_timeouts", 0))
    yield _counter("pidquorum_client_tls_handshake_failures", server.get("tls_handshake_failures", 0))
    yield _counter("pidquorum_client_read_pauses", server.get("read_pauses", 0))
    yield _counter("pidquorum_proposer_batches", st["proposer"]["batches"])
    yield _counter("pidquorum_proposer_records", st["proposer"]["records"])
