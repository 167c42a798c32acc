"""Brokers whose settings come from a TOML file (``python -m broker --config broker.toml``), with flags
over the file, against a real three-node quorum, served to an unmodified client (librdkafka)."""
from __future__ import annotations

import os

from confluent_kafka import Producer

from quorum.localcluster import free_ports
from quorum.telemetry.metrics import read_metrics


def produce_and_describe(bootstrap: str, topic: str):
    """One idempotent message (the broker hands out a producer ID from a quorum block), then Metadata."""
    errors: list = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "message.timeout.ms": 60_000,
                  "log_level": 3})
    p.produce(topic, value=b"v", on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
    assert p.flush(60) == 0 and errors == []
    return p.list_topics(timeout=10)


def test_a_broker_runs_from_its_file_and_flags_given_override_it(brokers):
    metrics_port = free_ports(1)[0]
    file = {"default_partitions": 3, "cluster_id": "from-the-file", "metrics_port": metrics_port,
            "pid_manager": {"max_prefetch_blocks": 2, "prefetch_threshold": 0.5}}
    a = brokers(1, config=file)
    b = brokers(2, "--partitions", "2", "--metrics-port", "0", "--cluster-id", "from-a-flag", config=file)

    md = produce_and_describe(a.bootstrap, "filed")
    assert len(md.topics["filed"].partitions) == 3 and md.cluster_id == "from-the-file"
    assert md.brokers[1].port == a.port  # listen, from the file
    assert os.path.isdir(a.data_dir)  # data_dir = "data": relative to the file's directory
    assert any(name.startswith("pidquorum_broker") for name in read_metrics(f"127.0.0.1:{metrics_port}"))

    md = produce_and_describe(b.bootstrap, "flagged")
    assert len(md.topics["flagged"].partitions) == 2 and md.cluster_id == "from-a-flag"
    assert os.path.isdir(b.data_dir) and open(b.log_path).read().count("Traceback") == 0
