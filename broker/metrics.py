"""Prometheus metrics of a broker front end, read from ``BrokerServer.status()`` at each scrape.

Like the node's (``quorum.metrics``), nothing is counted here: the families
are the broker's own counters, its ``ProducerIdManager.stats()`` and the
per-principal figures of its quota provider (``BrokerServer.quota_stats()``:
``{principal: {"rate", "tokens", "throttle_time_ms", "throttled_requests"}}``,
empty while no quota manager is wired in).  ``pidctl broker status`` reads
this endpoint, so both show the same numbers.
"""
from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, SummaryMetricFamily

BROKER_METRICS = {
    "pidquorum_broker": "This broker's identity (broker_id, listener).",
    "pidquorum_broker_epoch": "Broker epoch from the quorum's registration (-1: not registered).",
    "pidquorum_broker_pids_issued": "Producer IDs handed out by InitProducerId (idempotent producers).",
    "pidquorum_broker_prefetch_hits": "Times a spent block was replaced at once by a prefetched one.",
    "pidquorum_broker_prefetch_misses": "Times a block ran out with none prefetched (one per dry spell).",
    "pidquorum_broker_coordinator_load_in_progress": "InitProducerId answered COORDINATOR_LOAD_IN_PROGRESS.",
    "pidquorum_broker_duplicates": "Produce batches recognised as duplicates (answered, not appended again).",
    "pidquorum_broker_fenced_producers": "Answers PRODUCER_FENCED / INVALID_PRODUCER_EPOCH (any API).",
    "pidquorum_broker_requests": "Requests read.",
    "pidquorum_broker_bad_frames":
        "Frames that closed the connection: unreadable, oversized, or an unknown API key.",
    "pidquorum_broker_bad_requests":
        "Requests with a bad header or body, or ApiVersions at an unsupported version (answered with an error).",
    "pidquorum_broker_unsupported_versions":
        "Requests at a version the server does not serve, ApiVersions excepted (connection closed, as Kafka does).",
    "pidquorum_broker_produce_batches": "Produce batches appended.",
    "pidquorum_broker_groups": "Consumer groups this broker coordinates.",
    "pidquorum_broker_group_members": "Members of those groups.",
    "pidquorum_broker_group_rebalances": "Rebalances the groups began (since the broker started).",
    "pidquorum_broker_group_members_expired": "Members removed for not heartbeating within their session timeout.",
    "pidquorum_broker_offsets_committed": "Partition offsets committed (OffsetCommit).",
    "pidquorum_broker_txn_offsets_committed": "Partition offsets written pending in a transaction (TxnOffsetCommit).",
    "pidquorum_broker_txn_offsets_refused":
        "TxnOffsetCommits refused because their transaction ended while they were checked.",
    "pidquorum_broker_init_producer_id_requests": "InitProducerId requests.",
    "pidquorum_broker_transactions": "Transactions this broker completed, by outcome (committed, aborted), and those "
                                     "it aborted for running past their timeout (timed_out).",
    "pidquorum_broker_txn_step_seconds":
        "Time of the transaction coordinator's steps, by step: add, end, verify (quorum round trips on the "
        "client's path), complete (markers and completion, after EndTxn's answer), wait (a step waiting for "
        "that completion).",
    "pidquorum_broker_connections": "Client connections open.",
    "pidquorum_broker_connections_refused":
        "Connections closed at once: over max_connections or max_connections_per_ip.",
    "pidquorum_broker_authentication_timeouts":
        "Connections closed for not completing TLS (tls_handshake_timeout_ms) or SASL (authentication_timeout_ms) "
        "in time.",
    "pidquorum_broker_tls_handshake_failures": "TLS handshakes that failed (other than by timing out).",
    "pidquorum_broker_read_pauses": "Times a connection's socket was left unread: max_connection_buffer_bytes waiting.",
    "pidquorum_broker_read_ahead_bytes": "Bytes of requests read and not yet handled, all connections.",
    "pidquorum_broker_fetch_waits": "Times a Fetch started waiting for an append (long poll).",
    "pidquorum_broker_fetch_wakeups": "Times a waiting Fetch was woken by an append to a partition it reads.",
    "pidquorum_broker_describe_producers_truncated": "DescribeProducers partitions cut at describe_producers_limit.",
    "pidquorum_broker_evicted_producers_refused":
        "Batches answered UNKNOWN_PRODUCER_ID: their producer was evicted by max_producers_per_partition.",
    "pidquorum_broker_producers": "Producers whose idempotence state the broker keeps, all partitions.",
    "pidquorum_broker_producers_with_older_batches":
        "Of those, producers inside the retry window (their 4 batches before the last are kept too).",
    "pidquorum_broker_producer_evictions": "Producers evicted by max_producers_per_partition.",
    "pidquorum_broker_producer_state_bytes": "Bytes of the producer-state arrays, all partitions.",
    "pidquorum_broker_producer_snapshot_errors": "Producer-state snapshots that failed to write.",
    "pidquorum_broker_pid_reserve_ids": "Producer IDs in hand (rest of the current block plus queued blocks).",
    "pidquorum_broker_pid_target_reserve_ids": "Reserve the refill task keeps (sized from demand).",
    "pidquorum_broker_pid_queued_blocks": "Prefetched blocks queued behind the current one.",
    "pidquorum_broker_pid_demand_ids_per_second": "Estimated demand for producer IDs.",
    "pidquorum_broker_pid_allocate_latency_seconds": "EWMA of successful AllocateProducerIds round trips.",
    "pidquorum_broker_pid_blocks_fetched": "Blocks accepted from the quorum.",
    "pidquorum_broker_pid_blocks_rejected": "Blocks refused by validation (never used).",
    "pidquorum_broker_pid_fetch_errors": "Failed AllocateProducerIds calls, by error.",
    "pidquorum_broker_quota_rate_per_second": "New producer IDs per second a principal was measured using.",
    "pidquorum_broker_quota_limit_per_second": "A principal's producer_ids_rate quota (KIP-936).",
    "pidquorum_broker_quota_tokens": "Tokens left in a principal's producer-ID quota bucket.",
    "pidquorum_broker_quota_throttle_time_seconds": "Throttle time given to a principal's requests.",
    "pidquorum_broker_quota_throttled_requests": "Requests of a principal that were throttled.",
}

_COUNTERS = {  # BrokerServer.counters key -> metric
    "duplicates": "pidquorum_broker_duplicates",
    "fenced_producers": "pidquorum_broker_fenced_producers",
    "load_in_progress": "pidquorum_broker_coordinator_load_in_progress",
    "requests": "pidquorum_broker_requests",
    "bad_frames": "pidquorum_broker_bad_frames",
    "bad_requests": "pidquorum_broker_bad_requests",
    "unsupported_versions": "pidquorum_broker_unsupported_versions",
    "produce_batches": "pidquorum_broker_produce_batches",
    "group_rebalances": "pidquorum_broker_group_rebalances",
    "group_members_expired": "pidquorum_broker_group_members_expired",
    "offsets_committed": "pidquorum_broker_offsets_committed",
    "txn_offsets_committed": "pidquorum_broker_txn_offsets_committed",
    "txn_offsets_refused": "pidquorum_broker_txn_offsets_refused",
    "init_producer_id": "pidquorum_broker_init_producer_id_requests",
    "connections_refused": "pidquorum_broker_connections_refused",
    "authentication_timeouts": "pidquorum_broker_authentication_timeouts",
    "tls_handshake_failures": "pidquorum_broker_tls_handshake_failures",
    "read_pauses": "pidquorum_broker_read_pauses",
    "fetch_waits": "pidquorum_broker_fetch_waits",
    "fetch_wakeups": "pidquorum_broker_fetch_wakeups",
    "describe_producers_truncated": "pidquorum_broker_describe_producers_truncated",
    "evicted_producers_refused": "pidquorum_broker_evicted_producers_refused",
}
_PRODUCER_STATE = {  # Storage.producer_stats() key -> metric, family
    "producers": ("pidquorum_broker_producers", GaugeMetricFamily),
    "producers_with_older_batches": ("pidquorum_broker_producers_with_older_batches", GaugeMetricFamily),
    "evictions": ("pidquorum_broker_producer_evictions", CounterMetricFamily),
    "array_bytes": ("pidquorum_broker_producer_state_bytes", GaugeMetricFamily),
    "snapshot_errors": ("pidquorum_broker_producer_snapshot_errors", CounterMetricFamily),
}
# ProducerIdManager.stats() key ("counters.<key>": one of its counters) -> metric, family.  A figure that is
# None (no allocate latency measured yet) gives the family without a sample.
_PID_MANAGER = (
    ("counters.generated", "pidquorum_broker_pids_issued", CounterMetricFamily),
    ("counters.prefetch_hits", "pidquorum_broker_prefetch_hits", CounterMetricFamily),
    ("counters.prefetch_misses", "pidquorum_broker_prefetch_misses", CounterMetricFamily),
    ("reserve_ids", "pidquorum_broker_pid_reserve_ids", GaugeMetricFamily),
    ("target_reserve_ids", "pidquorum_broker_pid_target_reserve_ids", GaugeMetricFamily),
    ("queued_block_count", "pidquorum_broker_pid_queued_blocks", GaugeMetricFamily),
    ("rate_estimate_per_s", "pidquorum_broker_pid_demand_ids_per_second", GaugeMetricFamily),
    ("allocate_latency_ewma_s", "pidquorum_broker_pid_allocate_latency_seconds", GaugeMetricFamily),
    ("counters.blocks_fetched", "pidquorum_broker_pid_blocks_fetched", CounterMetricFamily),
    ("counters.blocks_rejected", "pidquorum_broker_pid_blocks_rejected", CounterMetricFamily),
)


def _counter(name: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, BROKER_METRICS[name], value=value)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, BROKER_METRICS[name], value=value)


def broker_families(st: dict) -> Iterable[Any]:
    """The metric families of one ``BrokerServer.status()`` dict."""
    yield InfoMetricFamily("pidquorum_broker", BROKER_METRICS["pidquorum_broker"],
                           value={"broker_id": str(st["broker_id"]), "listener": str(st["listen"])})
    for key, name in _COUNTERS.items():
        yield _counter(name, st["counters"].get(key, 0))
    yield _gauge("pidquorum_broker_connections", st.get("connections", 0))
    yield _gauge("pidquorum_broker_read_ahead_bytes", st.get("read_ahead_bytes", 0))
    yield _gauge("pidquorum_broker_groups", st["counters"].get("groups", 0))
    yield _gauge("pidquorum_broker_group_members", st["counters"].get("group_members", 0))
    ps = st.get("producer_state") or {}
    for key, (name, family) in _PRODUCER_STATE.items():
        yield family(name, BROKER_METRICS[name], value=ps.get(key, 0))
    pm = st.get("pid_manager")
    if pm is not None:
        c = pm["counters"]
        yield _gauge("pidquorum_broker_epoch", pm["broker_epoch"] if pm["broker_epoch"] is not None else -1)
        for key, name, family in _PID_MANAGER:
            section, _, field = key.rpartition(".")
            yield family(name, BROKER_METRICS[name], value=(pm[section] if section else pm)[field])
        errors = CounterMetricFamily("pidquorum_broker_pid_fetch_errors",
                                     BROKER_METRICS["pidquorum_broker_pid_fetch_errors"], labels=["error"])
        for err, n in sorted(c["fetch_errors"].items()):
            errors.add_metric([err], n)
        yield errors
    yield from quota_families(st.get("quota") or {})
    yield from txn_families(st)


def txn_families(st: dict) -> Iterable[Any]:
    """Transactions by outcome, and the coordinator's step times (``BrokerServer.status()["txn_steps"]``)."""
    c = st["counters"]
    outcomes = CounterMetricFamily("pidquorum_broker_transactions", BROKER_METRICS["pidquorum_broker_transactions"],
                                   labels=["outcome"])
    for outcome in ("committed", "aborted", "timed_out"):
        outcomes.add_metric([outcome], c.get(f"txn_{outcome}", 0))
    yield outcomes
    steps = SummaryMetricFamily("pidquorum_broker_txn_step_seconds",
                                BROKER_METRICS["pidquorum_broker_txn_step_seconds"], labels=["step"])
    for step, x in sorted((st.get("txn_steps") or {}).items()):
        steps.add_metric([step], count_value=x["count"], sum_value=x["seconds"])
    yield steps


def quota_families(quota: dict[str, dict]) -> Iterable[Any]:
    """Per-principal quota figures: ``{principal: {"rate", "quota", "tokens", "throttle_time_ms_total" (or
    "throttle_time_ms"), "throttled_requests"}}`` (``broker.quota.ProducerIdQuotaManager.stats()``).
    A figure a provider does not give is left out for that principal."""
    rate = GaugeMetricFamily("pidquorum_broker_quota_rate_per_second",
                             BROKER_METRICS["pidquorum_broker_quota_rate_per_second"], labels=["principal"])
    limit = GaugeMetricFamily("pidquorum_broker_quota_limit_per_second",
                              BROKER_METRICS["pidquorum_broker_quota_limit_per_second"], labels=["principal"])
    tokens = GaugeMetricFamily("pidquorum_broker_quota_tokens", BROKER_METRICS["pidquorum_broker_quota_tokens"],
                               labels=["principal"])
    throttle = CounterMetricFamily("pidquorum_broker_quota_throttle_time_seconds",
                                   BROKER_METRICS["pidquorum_broker_quota_throttle_time_seconds"],
                                   labels=["principal"])
    throttled = CounterMetricFamily("pidquorum_broker_quota_throttled_requests",
                                    BROKER_METRICS["pidquorum_broker_quota_throttled_requests"],
                                    labels=["principal"])
    for principal, q in sorted(quota.items()):
        label = [str(principal)]
        if q.get("rate") is not None:
            rate.add_metric(label, float(q["rate"]))
        if q.get("quota") is not None:
            limit.add_metric(label, float(q["quota"]))
        if q.get("tokens") is not None:
            tokens.add_metric(label, float(q["tokens"]))
        total = q.get("throttle_time_ms_total", q.get("throttle_time_ms"))
        if total is not None:
            throttle.add_metric(label, float(total) / 1000.0)
        if q.get("throttled_requests") is not None:
            throttled.add_metric(label, float(q["throttled_requests"]))
    return [rate, limit, tokens, throttle, throttled]
