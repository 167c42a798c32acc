"""ProducerIdQuotaManager (KIP-936): token bucket + time-layered Bloom filter, on a simulated clock."""
from __future__ import annotations

import asyncio
import bisect
import json
import math
import os

import pytest

from broker.config import BrokerConfig
from broker.quota import (
    STATS_FILE,
    LayeredBloomFilter,
    ProducerIdQuotaManager,
    QuotaConfigPoller,
    QuotaWindow,
    read_stats,
)
from records.wire.errors import RequestTimedOutError

ROGUE, GOOD, FREE = "User:rogue", "User:good", "User:free"


def manager(rate=1.0, num=2, size_s=1.0, users=None, default=None, fpp=0.001, burst_s=60.0) -> ProducerIdQuotaManager:
    m = ProducerIdQuotaManager(QuotaWindow(num=num, size_s=size_s, false_positive_rate=fpp, burst_s=burst_s))
    entries = [{"user": u, "values": {"producer_ids_rate": r}} for u, r in (users or {"rogue": rate}).items()]
    if default is not None:
        entries.append({"user": None, "values": {"producer_ids_rate": default}})
    m.configure(entries)
    return m


def test_a_principal_without_a_quota_is_not_tracked():
    m = manager()
    assert all(m.check(FREE, pid, 0.0) == 0 for pid in range(10_000))
    assert FREE not in m.stats(0.0) and m.unlimited_checks == 10_000


def test_burst_then_throttle_with_the_time_until_the_next_token():
    m = manager(rate=1.0, num=2, size_s=1.0)  # burst = 1/s * 2 windows * 1 s = 2
    assert m.check(ROGUE, 100, 0.0) == 0
    assert m.check(ROGUE, 101, 0.0) == 0
    assert m.check(ROGUE, 102, 0.0) == 1000
    assert m.check(ROGUE, 102, 0.25) == 750
    assert m.check(ROGUE, 102, 1.0) == 0  # one token back after 1 s
    s = m.stats(1.0)[ROGUE]
    assert (s["new_pids"], s["throttled_requests"], s["throttle_time_ms"], s["quota"]) == (3, 2, 750, 1.0)
    assert s["tokens"] == 0.0 and s["burst"] == 2.0


def test_the_burst_is_burst_s_of_the_rate_not_the_whole_window():
    # KIP-936's defaults: remembered for 11 x 3600 s; the bucket holds 10 s of the rate, not 11 hours of it.
    m = manager(rate=10.0, num=11, size_s=3600.0, burst_s=10.0)
    assert [m.check(ROGUE, pid, 0.0) for pid in range(100)] == [0] * 100
    assert m.check(ROGUE, 100, 0.0) == 100  # the 101st waits for the next token
    s = m.stats(0.0)[ROGUE]
    assert (s["burst"], s["new_pids"], s["throttled_requests"]) == (100.0, 100, 1)
    # then the rate: 10 more in the next second, whatever is offered
    admitted = sum(m.check(ROGUE, 1000 + i, 0.01 * (i + 1)) == 0 for i in range(105))
    assert admitted == 10
    assert all(m.check(ROGUE, pid, 1.0) == 0 for pid in range(100))  # the first 100 are still remembered


def test_the_burst_is_capped_at_the_window_and_at_least_one_token():
    assert QuotaWindow(num=2, size_s=1.0, burst_s=60.0).burst(5.0) == 10.0  # 5/s x 2 s, not 5/s x 60 s
    assert QuotaWindow(burst_s=10.0).burst(0.01) == 1.0
    assert QuotaWindow(burst_s=10.0).burst(1000.0) == 10_000.0
    assert QuotaWindow().burst(10.0) == 600.0  # the default: 60 s of the rate


def test_admissions_never_exceed_the_burst_plus_the_rate_over_any_interval():
    rate, burst_s = 20.0, 5.0
    m = manager(rate=rate, num=4, size_s=30.0, burst_s=burst_s)
    times = []
    pid = 0
    for step in range(6000):  # 60 s of a rogue offering 10 new PIDs every 10 ms (50x its quota)
        now = step * 0.01
        for _ in range(10):
            if m.check(ROGUE, pid, now) == 0:
                times.append(now)
            pid += 1
    s = m.stats(now)[ROGUE]
    # Every PID was offered once, so a "seen" one is a false positive: it passed without a token.
    # That leak is the filter's price (a fraction of what is offered), outside the bucket's bound.
    leaked = s["seen_pids"]
    assert s["new_pids"] + leaked == len(times) and leaked <= 0.001 * pid
    assert s["new_pids"] <= rate * burst_s + rate * 60 + 1
    for i, t0 in enumerate(times):  # every interval [t0, t0 + d]: at most burst + rate * d (+ the leak)
        for d in (0.0, 1.0, 10.0, 59.0):
            in_window = bisect.bisect_right(times, t0 + d) - i
            assert in_window <= rate * burst_s + rate * d + 1 + leaked, (t0, d, in_window)


def test_the_broker_setting_reaches_the_quota_window():
    cfg = BrokerConfig(broker_id=0, quorum=["h:1"], producer_id_quota_burst_s=5.0)
    assert cfg.quota_window.burst_s == 5.0 and cfg.quota_window.burst(10.0) == 50.0
    assert BrokerConfig(broker_id=0, quorum=["h:1"]).quota_window.burst_s == 60.0


def test_a_seen_pid_never_costs_quota_even_with_no_tokens_left():
    m = manager(rate=1.0)
    m.check(ROGUE, 1, 0.0)
    m.check(ROGUE, 2, 0.0)
    assert m.check(ROGUE, 3, 0.0) > 0
    for i in range(1000):
        assert m.check(ROGUE, 1, i * 0.001) == 0 and m.check(ROGUE, 2, i * 0.001) == 0
    assert m.stats(1.0)[ROGUE]["seen_pids"] == 2000


def test_a_refused_pid_is_not_remembered_its_retry_costs_a_token():
    m = manager(rate=1.0)
    m.check(ROGUE, 1, 0.0)
    m.check(ROGUE, 2, 0.0)
    assert m.check(ROGUE, 3, 0.0) == 1000
    assert m.check(ROGUE, 3, 0.5) == 500  # still new: refusals add nothing to the filter
    assert m.check(ROGUE, 3, 1.0) == 0
    assert m.check(ROGUE, 3, 1.0) == 0


def test_an_idle_pid_is_forgotten_after_the_window_a_busy_one_is_not():
    m = manager(rate=10.0, num=4, size_s=1.0)  # remembered for 4 s
    m.check(ROGUE, 1, 0.0)  # idle after this
    m.check(ROGUE, 2, 0.0)  # keeps producing
    t = 0.0
    while t < 20:
        t += 0.5
        assert m.check(ROGUE, 2, t) == 0
    before = m.stats(t)[ROGUE]["new_pids"]
    assert m.check(ROGUE, 1, t) == 0  # admitted again, as a new PID
    after = m.stats(t)[ROGUE]
    assert after["new_pids"] == before + 1 and after["refreshed_pids"] >= 1
    assert m.stats(t)[ROGUE]["new_pids"] == 3  # PID 2 was never counted twice


def test_user_quota_wins_over_the_default_and_default_applies_to_anonymous():
    m = manager(users={"rogue": 1.0}, default=100.0)
    assert all(m.check("User:ANONYMOUS", pid, 0.0) == 0 for pid in range(200))  # burst 100/s * 2 * 1 s
    assert m.check("User:ANONYMOUS", 10_000, 0.0) == 10  # the next token in 1/100 s
    assert m.check(ROGUE, 1, 0.0) == 0 and m.check(ROGUE, 2, 0.0) == 0 and m.check(ROGUE, 3, 0.0) == 1000
    assert m.stats(0.0)["User:ANONYMOUS"]["quota_source"] == "default"
    assert (m.stats(0.0)["User:ANONYMOUS"]["quota"], m.stats(0.0)[ROGUE]["quota"]) == (100.0, 1.0)
    assert m.stats(0.0)[ROGUE]["quota_source"] == "user"


def test_changing_and_lifting_a_quota():
    m = manager(rate=1.0)
    m.check(ROGUE, 1, 0.0)
    m.check(ROGUE, 2, 0.0)
    assert m.check(ROGUE, 3, 0.0) > 0
    m.configure([{"user": "rogue", "values": {"producer_ids_rate": 1000.0}}])
    assert m.check(ROGUE, 3, 0.01) == 0  # refilled at the new rate
    assert m.check(ROGUE, 1, 0.01) == 0  # the filter survived the change
    m.configure([])
    assert ROGUE not in m.stats(0.02)
    assert all(m.check(ROGUE, pid, 0.02) == 0 for pid in range(10, 1000))


def test_bad_values_from_the_quorum_are_ignored_not_fatal():
    m = ProducerIdQuotaManager(QuotaWindow(num=2, size_s=1.0))
    m.configure([{"user": "a", "values": {"producer_ids_rate": float("nan")}},
                 {"user": "b", "values": {"producer_ids_rate": -1.0}}, {"user": "c", "values": {}}])
    assert m.config()["users"] == {}


def test_sweep_forgets_idle_principals():
    m = manager(rate=1.0, num=2, size_s=1.0)
    m.check(ROGUE, 1, 0.0)
    assert m.sweep(1.0) == 0
    assert m.sweep(10.0) == 1 and ROGUE not in m.stats(10.0)


def test_memory_is_bounded_by_the_quota_not_by_the_pids_that_arrive():
    rate, num, size = 50.0, 3, 1.0
    m = manager(rate=rate, num=num, size_s=size)
    layer = LayeredBloomFilter(m.window, m.window.layer_items(rate))
    layer.add(0, 0.0)
    bound = m.window.max_layers * layer.nbytes
    peak = 0
    pid = 0
    for step in range(2000):  # 200 s of a rogue offering 100 new PIDs every 0.1 s (20x its quota)
        now = step * 0.1
        for _ in range(100):
            m.check(ROGUE, pid, now)
            pid += 1
        peak = max(peak, m.stats(now)[ROGUE]["filter_bytes"])
    s = m.stats(now)[ROGUE]
    assert pid == 200_000
    assert 0 < peak <= bound
    assert s["filter_layers"] <= m.window.max_layers and s["layers_dropped_early"] == 0
    # admitted about rate * time + burst, everything else refused
    assert rate * 200 <= s["new_pids"] <= rate * 200 + m.window.burst(rate) + 1


def test_no_false_negatives_every_admitted_pid_in_the_window_passes():
    m = manager(rate=100.0, num=3, size_s=1.0, fpp=0.01)
    admitted = []
    for i in range(300):
        now = i * 0.01
        if m.check(ROGUE, 10_000 + i, now) == 0:
            admitted.append(10_000 + i)
    assert len(admitted) == 300  # within burst + refill
    s = m.stats(3.0)[ROGUE]
    assert s["new_pids"] + s["seen_pids"] == 300  # each once: new, or (a false positive at 1 %) seen
    assert all(m.check(ROGUE, pid, 3.0) == 0 for pid in admitted)
    assert m.stats(3.0)[ROGUE]["new_pids"] == s["new_pids"]


@pytest.mark.parametrize("rate", [100.0, 1000.0])
def test_false_positives_with_every_layer_full_are_within_a_binomial_bound(rate):
    """Never-seen PIDs against a filter whose layers are all full, with window_num + 1 layers (the target)
    and with max_layers (the worst case), for two quotas.  PIDs are consecutive, as the quorum hands them
    out.  Given the layers, each lookup of a new key is a Bernoulli trial with the chance computed above:
    the count must lie within 4.5 standard deviations of it (a filter whose bit positions are random fails
    this once in 150,000 runs), and that chance within 15 % of what the target promises.  (The chance
    given the layers is LayeredBloomFilter.false_positive_rate(): Bloom-filter theory from their fill.)"""
    w = QuotaWindow(num=11, size_s=10.0, false_positive_rate=0.01)  # layers of 1,000 and 10,000 PIDs
    filt = LayeredBloomFilter(w, w.layer_items(rate))
    pid, n = 1_000_000, 100_000
    for layers in (w.num + 1, w.max_layers):
        while len(filt.layers) < layers or filt.layers[-1].count < filt.layer_items:
            filt.add(pid, 0.0)  # at one instant: layers roll by count only
            pid += 1
        assert len(filt.layers) == layers and all(x.count == filt.layer_items for x in filt.layers)
        base = 10**12 + layers * n  # never added: a later block of IDs
        hits = sum(1 for q in range(base, base + n) if filt.find(q) is not None)
        p = filt.false_positive_rate()
        target = 1 - (1 - w.layer_false_positive_rate) ** layers  # = false_positive_rate at num + 1 layers
        assert abs(p - target) <= 0.15 * target, (layers, p, target)
        assert abs(hits - n * p) <= 4.5 * math.sqrt(n * p * (1 - p)), (layers, hits, n * p)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(num=0), "window num"), (dict(num=True), "window num"), (dict(size_s=0), "window size"),
    (dict(size_s=float("inf")), "window size"), (dict(false_positive_rate=0.0), "false positive"),
    (dict(false_positive_rate=0.5), "false positive"), (dict(burst_s=0), "burst"),
    (dict(burst_s=float("nan")), "burst"), (dict(burst_s=True), "burst"), (dict(burst_s=8 * 86400), "burst"),
])
def test_bad_window_settings_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        QuotaWindow(**kwargs)


class FakeQuorum:
    """Stands in for QuorumClient.describe_client_quotas (the real one is exercised in the broker test)."""

    def __init__(self):
        self.entries = [{"user": "rogue", "values": {"producer_ids_rate": 2.0}}]
        self.fail = False

    async def describe_client_quotas(self):
        if self.fail:
            raise RequestTimedOutError("no node answered")
        return self.entries, "127.0.0.1:1"


def test_poller_applies_keeps_last_config_on_failure_and_writes_stats(tmp_path):
    m = ProducerIdQuotaManager(QuotaWindow(num=2, size_s=1.0))
    q = FakeQuorum()
    p = QuotaConfigPoller(m, q, interval_s=0.01, stats_path=str(tmp_path / STATS_FILE))
    assert asyncio.run(p.refresh()) is True
    m.check(ROGUE, 7)
    assert (m.stats()[ROGUE]["quota"], m.stats()[ROGUE]["quota_source"]) == (2.0, "user")
    q.fail = True
    assert asyncio.run(p.refresh()) is False
    # last known configuration stays in force
    assert (m.stats()[ROGUE]["quota"], m.stats()[ROGUE]["quota_source"]) == (2.0, "user")
    p.write_stats()
    data = read_stats(str(tmp_path))
    assert data["principals"][ROGUE]["new_pids"] == 1
    assert data["freshness"]["read_from"] == "127.0.0.1:1" and "RequestTimedOutError" in data["freshness"]["last_error"]
    assert data["config"]["users"] == {"rogue": 2.0}


def test_read_stats_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no quota stats"):
        read_stats(str(tmp_path))
    with open(os.path.join(tmp_path, STATS_FILE), "w") as f:
        json.dump([1], f)
    with pytest.raises(ValueError, match="not a quota stats file"):
        read_stats(str(tmp_path))
