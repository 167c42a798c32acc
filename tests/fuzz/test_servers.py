"""Garbage against running servers: a real three-node quorum and a real broker process get
random and mutated frames (every API of their tables, structured corruptions, raw byte
streams) over many concurrent connections.  Afterwards every process is alive and serves a
normal client, each input got the outcome the in-process decoder predicts (an answer, or a
closed connection for an unreadable frame; never silence), and the quorum's replicated
state -- latest block, next ID, registrations and epochs, transactional ids, migration,
commit index -- is exactly what it was: no garbage allocated a block (the audit trails
hold only the control blocks).  Seeded: ``RandomSource(random.Random(seed))``.
"""
from __future__ import annotations

import asyncio
import random
import struct
import uuid

from kio.schema.metadata.v10.request import MetadataRequestTopic

from quorum.client import api as p
from quorum.client.quorum import Connection, QuorumClient, RetryPolicy
from tests.broker.test_frontend_bad_input import batch, call, init_pid, produce
from tests.conftest import run, wait_for
from tests.fuzz import inputs as F
from tests.fuzz import servers as S
from records.wire import kafka
from records.wire.errors import Errors

CONTROL_BROKER = 4242


def _leader_state(cluster) -> tuple[int, dict]:
    return cluster.leader_state(20)


def _converged(cluster, want_commit: int) -> dict:
    """Every node's summary once all have applied ``want_commit``."""
    def check():
        ds = cluster.describe_all()
        if len(ds) == 3 and all(d["applied_index"] >= want_commit for d in ds.values()):
            return ds
        return None
    return wait_for(check, 20, what=f"every node to apply index {want_commit}")


def test_quorum_survives_garbage_and_its_state_does_not_move(cluster):
    cluster.leader(timeout=20)

    async def control_setup():
        c = QuorumClient(cluster.lc.client_addresses(), RetryPolicy(timeout=20.0, attempt_timeout=3.0))
        try:
            epoch = await c.register_broker(CONTROL_BROKER)
            return epoch, await c.allocate(CONTROL_BROKER, epoch)
        finally:
            await c.close()
    epoch, first = run(control_setup())
    leader_id, before = _leader_state(cluster)
    before_nodes = _converged(cluster, before["raft"]["commit_index"])

    inputs, drawn = S.make_inputs("quorum", F.RandomSource(random.Random(7300)), F.examples(3000), {CONTROL_BROKER})
    addresses = cluster.lc.client_addresses()

    async def fuzz():
        per_node = [inputs[i::len(addresses)] for i in range(len(addresses))]
        results = await asyncio.gather(*(S.blast(a, chunk, connections=4) for a, chunk in zip(addresses, per_node)))
        total = results[0]
        for r in results[1:]:
            total += r
        return total
    counts = run(fuzz())
    print(f"quorum fuzz: {len(inputs)} inputs sent, drawn {dict(drawn)}, outcomes {dict(counts)}")
    assert not S.problems(counts), counts
    assert counts["answered"] > len(inputs) // 3 and counts["closed"] > 0, counts

    # (b) nothing replicated moved: same summary and commit index on the leader, same summary everywhere
    leader_after, after = _leader_state(cluster)
    assert after["state"] == before["state"]
    term_delta = after["raft"]["term"] - before["raft"]["term"]
    if term_delta == 0:
        assert after["raft"]["commit_index"] == before["raft"]["commit_index"]
    else:  # a new leader commits one empty barrier entry before serving
        assert after["raft"]["commit_index"] - before["raft"]["commit_index"] <= term_delta
    for node_id, d in _converged(cluster, after["raft"]["commit_index"]).items():
        assert d["state"] == before_nodes[node_id]["state"], node_id

    # (a) every node is alive and serves: ApiVersions itself, an allocation through it
    for n in cluster.lc.nodes():
        assert cluster.lc.alive(n.node_id), f"node {n.node_id} died"

    async def control_after(address):
        conn = Connection(address, "fuzz-check")
        try:
            body = await conn.call(kafka.request_entity(p.API_VERSIONS, 3, client_software_name="t",
                                                    client_software_version="1"), 10.0)
            assert int(body.error_code) == 0
        finally:
            conn.close()
        c = QuorumClient([address], RetryPolicy(timeout=20.0, attempt_timeout=3.0))
        try:
            return await c.allocate(CONTROL_BROKER, epoch)
        finally:
            await c.close()
    blocks = [run(control_after(a)) for a in addresses]
    assert blocks[0].start == before["state"]["next_producer_id"], "garbage moved the producer-ID cursor"
    for a, b in zip(blocks, blocks[1:]):
        assert b.start == a.start + a.length

    # no block was allocated by garbage: every node's audit trail holds only the control blocks
    final = _converged(cluster, _leader_state(cluster)[1]["raft"]["commit_index"])
    for n in cluster.lc.nodes():
        trail = S.audit_blocks(cluster.lc.data_dir(n.node_id))
        assert [b["broker_id"] for b in trail] == [CONTROL_BROKER] * 4, (n.node_id, trail)
        assert trail[0]["producer_id_start"] == first.start
    assert len(final) == 3


def test_broker_survives_garbage_and_the_quorum_state_does_not_move(cluster, brokers):
    cluster.leader(timeout=20)
    b = brokers(1, "--partitions", "2")

    seen: list[dict] = []

    def stable():  # the same state three polls in a row: the broker's start-up allocations are done
        seen.append(S.replicated_state(_leader_state(cluster)[1]))
        return seen[-1] if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] else None
    before = wait_for(stable, 30, interval=0.5, what="the broker's start-up allocations to settle")

    inputs, drawn = S.make_inputs("broker", F.RandomSource(random.Random(7400)), F.examples(1500), set())
    counts = run(S.blast(b.bootstrap, inputs, connections=8))
    print(f"broker fuzz: {len(inputs)} inputs sent, drawn {dict(drawn)}, outcomes {dict(counts)}")
    assert not S.problems(counts), counts
    assert counts["answered"] > len(inputs) // 3 and counts["closed"] > 0, counts

    assert b.proc.poll() is None, f"broker died:\n{b.tail()}"
    assert S.replicated_state(_leader_state(cluster)[1]) == before, "garbage sent to the broker moved quorum state"
    log = open(b.log_path, errors="replace").read()
    assert "Traceback" not in log, log[log.index("Traceback") - 300:][:3000]

    # the broker still serves: InitProducerId, an idempotent Produce, and its regression inputs
    code, pid, epoch = init_pid(b)
    assert code == Errors.NONE and pid >= 0 and epoch == 0
    err, offset, _ = produce(b, batch(pid=pid, epoch=epoch, seq=0, n=3), topic="after-fuzz")
    assert err == Errors.NONE and offset == 0

    # regression (found by the decoder fuzz): Metadata v10 asking for a topic by id (null name) is answered
    md = call(b, 3, 10, topics=(MetadataRequestTopic(topic_id=uuid.uuid4(), name=None),),
              allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
              include_topic_authorized_operations=False)
    assert md.topics[0].name == "" and int(md.topics[0].error_code) == Errors.UNKNOWN_TOPIC_OR_PARTITION

    # regression: a null (-1) non-nullable array is INVALID_REQUEST, and the broker goes on serving
    frame = struct.pack(">hhih", 0, 3, 11, 1) + b"c" + struct.pack(">h", -1) + struct.pack(">hi", -1, 5000) \
        + struct.pack(">i", -1)
    counts = run(S.blast(b.bootstrap, [S.Input(struct.pack(">i", len(frame)) + frame, "answer", "null-array")], 1))
    assert counts == {"answered": 1}
    assert init_pid(b)[0] == Errors.NONE
