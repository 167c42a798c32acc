"""quorum.stats.Histogram, the node's metric families and the endpoint, without a cluster."""
from __future__ import annotations

import asyncio
import os
import socket
import threading
import urllib.request

import pytest

from broker.metrics import BROKER_METRICS
from quorum.localcluster import free_ports
from quorum.metrics import QUORUM_METRICS, quorum_families
from quorum.stats import OTHER_BROKERS, AllocationCounts, Histogram
from quorum.telemetry.metrics import MetricsEndpoint, MetricsUnavailable, make_registry, on_loop, read_metrics, serve_metrics
from tests.support.inproc import SimCluster
from tests.support.metrics import samples


def test_histogram_counts_cumulative_buckets_and_quantiles():
    h = Histogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.002, 0.05, 0.05, 3.0):
        h.observe(v)
    s = h.snapshot()
    assert s["count"] == 6 and s["sum_s"] == pytest.approx(3.1035)
    assert s["buckets"] == [[0.001, 2], [0.01, 3], [0.1, 5], ["+Inf", 6]]  # le: 0.001 counts 0.001 itself
    assert s["p50_s"] == 0.01 and s["p99_s"] is None  # the 99th is in +Inf: no bound to give
    assert Histogram((1.0,)).snapshot()["p50_s"] is None
    with pytest.raises(ValueError):
        Histogram((0.1, 0.01))


def test_histogram_is_safe_across_threads():
    h = Histogram((0.5,))
    threads = [threading.Thread(target=lambda: [h.observe(0.1) for _ in range(5000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.snapshot()["count"] == 20_000


def test_allocation_counts_are_per_registered_broker_and_bounded():
    registered = {1, 2, 3}
    c = AllocationCounts(limit=4)
    for b in (1, 2, 1):
        c.count(b, 1000, registered.__contains__)
    assert c.snapshot() == {"1": {"blocks": 2, "ids": 2000}, "2": {"blocks": 1, "ids": 1000}}
    # Brokers come and go with ever new ids (each registers, allocates, is gone): the table stays bounded,
    # the registered ones keep their own counters, and nothing counted is lost.
    for b in range(100, 10_100):
        registered.add(b)
        c.count(b, 10, registered.__contains__)
        c.count(1, 1, registered.__contains__)
        registered.discard(b)
        assert len(c) <= c.limit + 1
    snap = c.snapshot()
    assert snap["1"] == {"blocks": 10_002, "ids": 2000 + 10_000} and snap["2"] == {"blocks": 1, "ids": 1000}
    assert sum(v["blocks"] for v in snap.values()) == 3 + 2 * 10_000
    assert sum(v["ids"] for v in snap.values()) == 3000 + 10 * 10_000 + 10_000


def test_allocation_counts_with_every_slot_held_by_registered_brokers_count_the_rest_as_other():
    c = AllocationCounts(limit=2)
    for b in (5, 6, 7, 8, 7):
        c.count(b, 100, lambda broker: True)
    c.count(9, 100, lambda broker: broker != 9)  # not registered (a record replayed after its unregistration)
    assert c.snapshot() == {"5": {"blocks": 1, "ids": 100}, "6": {"blocks": 1, "ids": 100},
                            OTHER_BROKERS: {"blocks": 4, "ids": 400}}


def test_a_service_keeps_allocation_counters_for_registered_brokers_only():
    """The real apply path (one in-process node): brokers that register, allocate and shut down."""
    with SimCluster(size=1) as c:
        service = c.leader().service
        service.allocations.limit = 3
        for b in range(8):
            epoch = c.register(b)
            c.allocate(b, epoch)
            if b >= 1:  # broker 0 stays; the others shut down (UnregisterBrokerRecord)
                c._with_leader(lambda state, now, b=b, epoch=epoch: state.registrations.generate_heartbeat(
                    b, epoch, False, True, now), 20.0, None)
        c.allocate(0, service.state.registrations.brokers[0].broker_epoch)
        allocations = service.describe()["allocations"]
    assert allocations["0"] == {"blocks": 2, "ids": 2000}
    assert len(allocations) <= 4 and OTHER_BROKERS in allocations
    assert sum(v["blocks"] for v in allocations.values()) == 9


def _status(term=3, commit=10, applied=8, state="leader", allocations=None, snapshot_age=12.5) -> dict:
    lat = Histogram((0.01, 0.1))
    lat.observe(0.005)
    sync = Histogram((0.001,))
    sync.observe(0.0004)
    sync.observe(0.002)
    return {
        "node_id": 2, "client_address": "127.0.0.1:1",
        "raft": {"self": "127.0.0.1:2", "state": state, "leader": "127.0.0.1:2", "term": term,
                 "commit_index": commit, "last_applied": applied, "log_len": 4, "has_quorum": True,
                 "peers": {"127.0.0.1:3": {"connected": True, "match_index": 7, "next_index": 8, "lag_entries": 3},
                           "127.0.0.1:4": {"connected": False, "match_index": 0, "next_index": 1,
                                           "lag_entries": None}},
                 "journal_syncs": 2, "journal_sync_latency": sync.snapshot(), "leader_changes": 4},
        "applied_index": applied, "state": {"next_producer_id": 5000, "brokers": [{}, {}]},
        "block_size": 1000,
        "snapshot": {"path": "/x", "bytes": 321, "mtime_ns": 1, "age_s": snapshot_age},
        "journal_entries": 4, "allocations": allocations if allocations is not None else {"7": {"blocks": 5, "ids": 5000}},
        "server": {"requests": 11, "forwarded": 1, "throttled": 2, "bad_frames": 0, "bad_requests": 1,
                   "unsupported_versions": 3},
        "proposer": {"batches": 6, "records": 9}, "allocate_latency": lat.snapshot(),
    }


def test_quorum_families_map_every_figure_of_the_status_dict():
    st = _status()
    m = samples(make_registry(lambda: st, quorum_families))
    assert m[("pidquorum_raft_term", ())] == 3
    assert m[("pidquorum_raft_commit_index", ())] == 10
    assert m[("pidquorum_raft_apply_lag_entries", ())] == 2
    assert m[("pidquorum_raft_state", (("state", "leader"),))] == 1
    assert m[("pidquorum_raft_state", (("state", "follower"),))] == 0
    assert m[("pidquorum_raft_follower_lag_entries", (("peer", "127.0.0.1:3"),))] == 3
    assert ("pidquorum_raft_follower_lag_entries", (("peer", "127.0.0.1:4"),)) not in m  # not known: no sample
    assert m[("pidquorum_raft_follower_connected", (("peer", "127.0.0.1:4"),))] == 0
    assert m[("pidquorum_raft_leader_changes_total", ())] == 4
    assert m[("pidquorum_journal_sync_latency_seconds_count", ())] == 2
    assert m[("pidquorum_journal_sync_latency_seconds_bucket", (("le", "0.001"),))] == 1
    assert m[("pidquorum_snapshot_size_bytes", ())] == 321
    assert m[("pidquorum_snapshot_age_seconds", ())] == 12.5
    assert m[("pidquorum_allocations_total", (("broker_id", "7"),))] == 5
    assert m[("pidquorum_allocated_ids_total", (("broker_id", "7"),))] == 5000
    folded = samples(make_registry(lambda: _status(allocations={"7": {"blocks": 5, "ids": 5000},
                                                                OTHER_BROKERS: {"blocks": 2, "ids": 2000}}),
                                   quorum_families))
    assert folded[("pidquorum_allocations_total", (("broker_id", OTHER_BROKERS),))] == 2
    assert m[("pidquorum_allocation_latency_seconds_bucket", (("le", "0.01"),))] == 1
    assert m[("pidquorum_throttled_requests_total", ())] == 2
    assert m[("pidquorum_node_info", (("client_address", "127.0.0.1:1"), ("node_id", "2"),
                                      ("raft_address", "127.0.0.1:2")))] == 1
    names = {fam.name for fam in quorum_families(st)}
    assert names == set(QUORUM_METRICS)
    # Reads at scrape time: a changed status shows at the next scrape, nothing is cached.
    st["raft"]["term"] = 9
    assert samples(make_registry(lambda: st, quorum_families))[("pidquorum_raft_term", ())] == 9


def test_no_snapshot_yet_means_no_age_sample():
    m = samples(make_registry(lambda: _status(snapshot_age=None), quorum_families))
    assert ("pidquorum_snapshot_age_seconds", ()) not in m


def test_endpoint_reads_the_status_on_the_loop_and_read_metrics_parses_it():
    seen_threads = []

    def status():
        seen_threads.append(threading.get_ident())
        return _status()

    async def go():
        port = free_ports(1)[0]
        endpoint = serve_metrics("127.0.0.1", port, status, quorum_families)
        try:
            assert endpoint.address == f"127.0.0.1:{port}"
            figures = await asyncio.get_running_loop().run_in_executor(None, read_metrics, endpoint.address)
        finally:
            endpoint.stop()
        return figures

    figures = asyncio.run(go())
    assert seen_threads == [threading.get_ident()]  # the loop's thread, not the HTTP server's
    assert figures["pidquorum_raft_commit_index"] == 10
    assert figures["pidquorum_allocations_total"] == {"7": 5}
    assert figures["pidquorum_raft_state"] == {"follower": 0, "candidate": 0, "leader": 1}
    assert not any(k.startswith("pidquorum_process_") or k.endswith("_bucket") for k in figures)


def test_port_zero_is_off():
    async def go():
        return serve_metrics("127.0.0.1", 0, _status, quorum_families)
    assert asyncio.run(go()) is None


def test_a_stuck_loop_fails_the_scrape_instead_of_reading_figures_off_the_loop():
    loop = asyncio.new_event_loop()  # never run: nothing it is asked to do ever happens
    try:
        endpoint = MetricsEndpoint(make_registry(on_loop(loop, _status, timeout=0.2), quorum_families),
                                   "127.0.0.1", free_ports(1)[0]).start()
        try:
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://{endpoint.address}/metrics", timeout=5)
            assert e.value.code == 500
            with pytest.raises(MetricsUnavailable):
                read_metrics(endpoint.address)
        finally:
            endpoint.stop()
    finally:
        loop.close()


def test_read_metrics_of_nothing_is_unavailable():
    with pytest.raises(MetricsUnavailable, match="cannot read"):
        read_metrics(f"127.0.0.1:{free_ports(1)[0]}", timeout=2)


def test_a_port_in_use_is_an_os_error_at_start():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError):
            MetricsEndpoint(make_registry(_status, quorum_families), "127.0.0.1", s.getsockname()[1]).start()


def test_docs_list_every_metric():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "metrics.md")) as f:
        doc = f.read()
    for name in list(QUORUM_METRICS) + list(BROKER_METRICS):
        assert f"`{name}" in doc, name
