"""Prometheus metrics of a quorum node (and the endpoint brokers use too).

Nothing is counted here.  A collector reads, at each scrape, the status dict
the process already keeps (``QuorumServer.status()``, which is also what
DescribeState answers and ``pidctl quorum status`` shows) and turns it into
metric families, so the endpoint and the CLI always show the same figures.

The status dict is taken on the process's event loop (the scrape runs in
the HTTP server's thread, the figures live on the loop), with a deadline:
a node whose loop is stuck answers the scrape with an error instead of
figures read mid-change.

Each process has its own ``CollectorRegistry`` (never the global one), so
several servers in one test process never mix their figures.

Metric names (node): see ``QUORUM_METRICS``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 5.0
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
    "pidquorum_allocations": "Producer-ID blocks committed per broker (applied by this process).",
    "pidquorum_allocated_ids": "Producer IDs committed per broker (applied by this process).",
    "pidquorum_allocation_latency_seconds": "AllocateProducerIds answered OK by this node, request to answer.",
    "pidquorum_requests": "Requests read on the client port.",
    "pidquorum_forwarded_requests": "Requests this follower forwarded to the leader.",
    "pidquorum_throttled_requests": "AllocateProducerIds answered THROTTLING_QUOTA_EXCEEDED.",
    "pidquorum_bad_frames": "Unreadable or oversized frames (connection closed).",
    "pidquorum_bad_requests": "Readable headers with a bad body or version (answered with an error).",
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
    yield _counter("pidquorum_proposer_batches", st["proposer"]["batches"])
    yield _counter("pidquorum_proposer_records", st["proposer"]["records"])


class StatusCollector(Collector):
    """Reads a status dict at each scrape and yields ``families(status)``."""

    def __init__(self, read_status: Callable[[], dict], families: Callable[[dict], Iterable[Any]]):
        self._read = read_status
        self._families = families

    def collect(self) -> Iterable[Any]:
        return list(self._families(self._read()))

    def describe(self) -> Iterable[Any]:
        return []  # figures are read at scrape time only (never at registration)


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], dict],
            timeout: float = SCRAPE_TIMEOUT_S) -> Callable[[], dict]:
    """A reader that runs ``fn`` on ``loop``'s thread and waits for its result (from another thread)."""
    def read() -> dict:
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            if fut.set_running_or_notify_cancel():  # False: the scrape gave up already
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the scraping thread
                    fut.set_exception(e)

        loop.call_soon_threadsafe(call)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise
    return read


def make_registry(read_status: Callable[[], dict], families: Callable[[dict], Iterable[Any]]) -> CollectorRegistry:
    """A registry of its own: the status collector plus the process's CPU, memory and fds."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(read_status, families))
    ProcessCollector(namespace="pidquorum", registry=registry)
    return registry


class MetricsEndpoint:
    """``GET /metrics`` on ``host:port`` (prometheus_client's threaded HTTP server)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self.registry, self.host, self.port = registry, host, port
        self._httpd = None
        self._thread: threading.Thread | None = None

    def start(self) -> "MetricsEndpoint":
        self._httpd, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._httpd.server_port
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return self

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


def serve_metrics(host: str, port: int, read_status: Callable[[], dict],
                  families: Callable[[dict], Iterable[Any]]) -> MetricsEndpoint | None:
    """Start the endpoint (``port`` 0 = off: returns None).  ``read_status`` runs on the caller's loop."""
    if not port:
        return None
    reader = on_loop(asyncio.get_running_loop(), read_status)
    return MetricsEndpoint(make_registry(reader, families), host, port).start()


class MetricsUnavailable(Exception):
    """An endpoint could not be read (refused, timed out, not Prometheus text)."""


def read_metrics(address: str, timeout: float = 5.0) -> dict[str, Any]:
    """Scrape ``http://address/metrics`` and return its ``pidquorum_*`` samples as
    ``{sample name: value}``, or ``{sample name: {label value: value}}`` for a labelled metric
    (labels joined as ``k=v,k=v`` when there are several); process_* and histogram buckets are left out."""
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise MetricsUnavailable(f"cannot read {url}: {reason}") from None
    out: dict[str, Any] = {}
    try:
        for fam in text_string_to_metric_families(text):
            if not fam.name.startswith("pidquorum_") or fam.name.startswith("pidquorum_process_"):
                continue
            for s in fam.samples:
                if s.name.endswith("_bucket") or s.name.endswith("_created"):
                    continue
                labels = {k: v for k, v in s.labels.items()}
                if not labels:
                    out[s.name] = s.value
                elif len(labels) == 1:
                    out.setdefault(s.name, {})[next(iter(labels.values()))] = s.value
                else:
                    out.setdefault(s.name, {})[",".join(f"{k}={v}" for k, v in sorted(labels.items()))] = s.value
    except ValueError as e:
        raise MetricsUnavailable(f"{url}: not Prometheus text: {e}") from None
    return out
