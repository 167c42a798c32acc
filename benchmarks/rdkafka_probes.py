"""librdkafka (confluent-kafka) clients of the broker benchmark, observed: producers whose protocol/eos
debug lines and 5 ms statistics are recorded (InitProducerId round trips, when a PID was assigned),
transactional and idempotent producer runs built on them, a burst of produce() and the partitions' high
watermarks.  How the timings are read: docs/benchmarks.md ("pidctl bench broker")."""
from __future__ import annotations

import array
import json
import logging
import re
import sys
import time
from collections import Counter

import confluent_kafka
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from .common import percentile
from .harness import log
from .report import summarize_ms

LOG_LAG_BOUND_MS = 2.0
RTT_RE = re.compile(r"Received InitProducerIdResponse \(v(\d+),.*rtt ([0-9.]+)ms")
ACQUIRED_RE = re.compile(r"Acquired PID\{Id:(-?\d+),Epoch:(-?\d+)\}")


class _Lines(logging.Handler):
    """librdkafka log lines as handed to Python, with the monotonic time of the hand-over."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


class RkProbe:
    """A confluent-kafka Producer whose logs (debug protocol,eos) and 5 ms stats are recorded.

    The stats callback closes over a list, not over the probe, so dropping the probe
    destroys the librdkafka handle at once (no reference cycle)."""

    def __init__(self, bootstrap: str, broker_id: int, **conf):
        self.handler = _Lines()
        lg = logging.Logger("rdkafka-probe")  # not registered: one per producer, garbage-collected with it
        lg.addHandler(self.handler)
        lg.setLevel(logging.DEBUG)
        stats: list[dict] = []
        self.stats = stats
        self.broker_id = broker_id
        self.t_create = time.monotonic()
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.sparse.connections": False,
                                  "statistics.interval.ms": 5, "debug": "protocol,eos", "logger": lg,
                                  "stats_cb": lambda s: stats.append(json.loads(s)), **conf})

    def broker_up(self) -> bool:
        return bool(self.stats) and any(b.get("nodeid") == self.broker_id and b.get("state") == "UP"
                                        for b in self.stats[-1].get("brokers", {}).values())

    def assigned_stats(self) -> dict | None:
        for s in self.stats:
            if s.get("eos", {}).get("idemp_state") == "Assigned":
                return s
        return None

    def poll_until(self, pred, timeout: float, step: float = 0.002) -> bool:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                return False
            self.producer.poll(step)
        return True

    def rtts_ms(self) -> list[float]:
        return [float(m.group(2)) for _, line in self.handler.lines for m in [RTT_RE.search(line)] if m]

    def acquired(self) -> tuple[float, int, int] | None:
        """(hand-over time, pid, epoch) of the first "Acquired PID{...}" line."""
        for t, line in self.handler.lines:
            m = ACQUIRED_RE.search(line)
            if m:
                return t, int(m.group(1)), int(m.group(2))
        return None

    def handed_over(self, needle: str) -> float | None:
        return next((t for t, line in self.handler.lines if needle in line), None)

    def close(self) -> float:
        t0 = time.perf_counter()
        self.producer = None  # rd_kafka_destroy()
        return time.perf_counter() - t0


def rk_transactional(bootstrap: str, tid: str, n: int, timeout: float, label: str) -> dict:
    """n producers with transactional id ``tid`` (or tid-i if tid ends with '-'): init_transactions() each."""
    init_s, connect_s, rtts, destroy_s = [], [], [], []
    acquired: list[tuple[int, int]] = []
    errors: Counter = Counter()
    multi_rtt = 0
    for i in range(n):
        t = f"{tid}{i}" if tid.endswith("-") else tid
        probe = RkProbe(bootstrap, 1, **{"transactional.id": t})
        if not probe.poll_until(probe.broker_up, 5.0):
            errors["broker connection not UP within 5 s (measured anyway)"] += 1
        connect_s.append(time.monotonic() - probe.t_create)
        t0 = time.perf_counter()
        try:
            probe.producer.init_transactions(timeout)
            init_s.append(time.perf_counter() - t0)
        except KafkaException as e:
            errors[f"init_transactions: {e.args[0].name()}"] += 1
        probe.producer.poll(0)  # hand the log lines queued during the call over to Python
        r = probe.rtts_ms()
        if r:
            rtts.append(r[-1])
            multi_rtt += len(r) > 1
        a = probe.acquired()
        if a:
            acquired.append((a[1], a[2]))
        destroy_s.append(probe.close())
        if (i + 1) % 50 == 0:
            log(f"  {label}: {i + 1}/{n}")
    return {"producers": n, "errors": dict(errors), "init_transactions": summarize_ms(init_s),
            "connect_before_init": summarize_ms(connect_s), "rdkafka_rtt": summarize_ms(rtts, 1.0),
            "producers_with_more_than_one_InitProducerId": multi_rtt, "destroy": summarize_ms(destroy_s),
            "acquired": acquired}


def rk_idempotent(bootstrap: str, n: int) -> dict:
    create_to_assigned, rtts, log_lag, log_acq_to_acq, lag_index = [], [], [], [], []
    errors: Counter = Counter()
    pids = []
    same_clock = sys.platform.startswith("linux")  # rd_clock() and time.monotonic() are both CLOCK_MONOTONIC
    for i in range(n):
        probe = RkProbe(bootstrap, 1, **{"enable.idempotence": True})
        # This thread polls without pause: stats and log lines are handed over as librdkafka queues them.
        if not probe.poll_until(lambda: probe.assigned_stats() is not None, 10.0, step=0.001):
            errors["no PID assigned within 10 s"] += 1
            probe.close()
            continue
        probe.producer.poll(0)
        s = probe.assigned_stats()
        assigned_at = s["ts"] / 1e6 - s["eos"]["idemp_stateage"] / 1e3
        if same_clock:
            create_to_assigned.append(assigned_at - probe.t_create)
        pids.append(s["eos"].get("producer_id"))
        r = probe.rtts_ms()
        if r:
            rtts.append(r[-1])
        a = probe.acquired()
        acq_start = probe.handed_over("Acquiring ProducerId")
        if a and same_clock:
            log_lag.append(a[0] - assigned_at)
            lag_index.append(i)
        if a and acq_start is not None:
            log_acq_to_acq.append(a[0] - acq_start)
        probe.close()
        if (i + 1) % 50 == 0:
            log(f"  idempotent librdkafka producers: {i + 1}/{n}")
    worst = max(range(len(log_lag)), key=lambda j: abs(log_lag[j]), default=None)
    lag_ms = sorted(x * 1000 for x in log_lag)
    sound = bool(lag_ms) and all(abs(x) <= LOG_LAG_BOUND_MS for x in lag_ms)
    return {"producers": n, "errors": dict(errors), "create_to_pid_assigned": summarize_ms(create_to_assigned),
            "rdkafka_rtt": summarize_ms(rtts, 1.0),
            "logger_acquiring_to_acquired": summarize_ms(log_acq_to_acq),
            "logger_lag_vs_stats_ms": {"n": len(lag_ms), "min": lag_ms[0] if lag_ms else None,
                                       "p50": percentile(lag_ms, 50), "max": lag_ms[-1] if lag_ms else None,
                                       "bound": LOG_LAG_BOUND_MS,
                                       "worst_at_producer": None if worst is None else lag_index[worst],
                                       "over_bound": sum(abs(x) > LOG_LAG_BOUND_MS for x in lag_ms)},
            "logger_timing_sound": sound,
            "pids_distinct": len(pids) == len(set(pids)), "pids": len(pids)}


def produce_round(bootstrap: str, topic: str, n: int, size: int, conf: dict, broker_cpu) -> dict:
    lat = array.array("d")
    errors: Counter = Counter()
    lines = _Lines()
    lg = logging.Logger("rdkafka-produce")
    lg.addHandler(lines)
    lg.setLevel(logging.WARNING)

    def dr(err, msg):
        if err is not None:
            errors[err.name()] += 1
        else:
            lat.append(msg.latency())

    prod = Producer({"bootstrap.servers": bootstrap, "enable.sparse.connections": False, "linger.ms": 5,
                     "message.timeout.ms": 60_000, "logger": lg, **conf})
    value = b"x" * size
    for i in range(100):  # warm-up: connection, metadata, PID (idempotent)
        prod.produce(topic, value=value, on_delivery=dr)
    if prod.flush(30):
        raise RuntimeError(f"{topic}: warm-up not delivered within 30 s")
    warm_ok, warm_err = len(lat), sum(errors.values())
    lat = array.array("d")
    errors.clear()
    buffer_full = 0
    cpu0 = broker_cpu()
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                prod.produce(topic, value=value, on_delivery=dr)
                break
            except BufferError:
                buffer_full += 1
                prod.poll(0.001)
        if i % 500 == 0:
            prod.poll(0)
    left = prod.flush(120)
    wall = time.perf_counter() - t0
    cpu1 = broker_cpu()
    prod = None
    return {"messages": n, "wall_s": wall, "delivered": len(lat), "errors": dict(errors), "undelivered": left,
            "broker_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            "latencies": lat, "buffer_full_waits": buffer_full, "warmup_delivered": warm_ok,
            "warmup_errors": warm_err, "client_warnings": len(lines.lines)}


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks", "enable.auto.commit": False,
                  "log_level": 3})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, i), timeout=10)[1] for i in range(partitions)]
    finally:
        c.close()


def client_versions() -> dict:
    """confluent-kafka's and librdkafka's versions, for a results' environment."""
    return {"confluent_kafka": getattr(confluent_kafka, "__version__", None) or confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0]}
