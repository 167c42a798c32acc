"""docs/brokers.md, "Two brokers on one machine", runs as written and its claims hold: a local cluster
and two brokers on it, an idempotent confluent-kafka producer on each; each broker's Metadata lists only
itself, the producer IDs come from disjoint blocks the quorum gave each broker, each broker has only its
own records; a producer given both brokers writes to one; a transactional id used through the second
broker fences its producer on the first."""
from __future__ import annotations

import json
import os
import re

from quorum.localcluster import LocalCluster, free_ports
from tests.docs.doc_shell import Block, DocShell, assert_prints, blocks, with_ports

SECTION = "Two brokers on one machine"
PROBE = re.compile(r"127\.0\.0\.1:(\d+): Metadata lists brokers \[(\d+)\], the leader of greetings/0 is (\d+), "
                   r"producer IDs \[(\d+)\], (\d+) records")


def _metadata_brokers(bootstrap: str) -> dict[int, str]:
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}


def test_the_brokers_doc_runs_as_written_and_its_claims_hold(tmp_path, request):
    steps = blocks("brokers.md", SECTION)
    assert len(steps) == 6 and steps[-1].text.startswith("kill"), [s.text[:40] for s in steps]
    ports = free_ports(2)
    steps[0] = with_ports(steps[0], ports)
    port_of = {1: ports[0], 2: ports[1]}
    work = tmp_path / "work"
    shell = DocShell(str(work), str(tmp_path / "steps"))
    try:
        for step in steps:
            rc, out = shell.run(step)
            assert rc == 0, out
            assert "Traceback" not in out, out
            assert_prints(step, out)
            if "broker start" in step.text:  # each broker took its first block before any client came
                history = json.loads(shell.run(Block("sh", "pidctl blocks history -o json", "history"))[1])
                assert sorted(b["broker_id"] for b in history) == [1, 2], history
            if "probe.py produce" in step.text:
                rows = {int(m.group(1)): m for m in map(PROBE.fullmatch, out.splitlines()) if m}
                assert set(rows) == set(ports), out
                history = json.loads(shell.run(Block("sh", "pidctl blocks history -o json", "history"))[1])
                spans = sorted((b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"], b["broker_id"])
                               for b in history)
                assert all(end <= nxt for (_, end, _), (nxt, _, _) in zip(spans, spans[1:])), spans  # disjoint
                pids = {}
                for broker_id, port in port_of.items():
                    m = rows[port]
                    assert (int(m.group(2)), int(m.group(3)), int(m.group(5))) == (broker_id, broker_id, 5), m.group(0)
                    assert _metadata_brokers(f"127.0.0.1:{port}") == {broker_id: f"127.0.0.1:{port}"}
                    pid = pids[broker_id] = int(m.group(4))
                    assert any(s <= pid < e and b == broker_id for s, e, b in spans), (pid, broker_id, spans)
                assert pids[1] != pids[2]
                assert {b for _, _, b in spans} == {1, 2}, spans
            if '"topic.metadata.refresh.interval.ms"' in step.text:
                sent = int(re.search(r"^(\d+) sent$", out, re.M).group(1))
                counts = sorted(int(n) for n in re.findall(r"^127\.0\.0\.1:\d+: (\d+) records of both$", out, re.M))
                assert sent > 0 and counts == [0, sent], out
    finally:
        shell.close_after(request)
        if os.path.exists(work / ".pidquorum"):
            LocalCluster(str(work / ".pidquorum")).down(timeout=5)  # the doc's nodes run in sessions of their own
