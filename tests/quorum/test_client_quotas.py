"""ClientQuotaManager (KIP-936 producer_ids_rate as replicated config): generate / replay / snapshot,
no Raft running; and the AlterClientQuota / DescribeClientQuotas RPCs against a real quorum."""
from __future__ import annotations

import math

import pytest

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.client_quotas import PRODUCER_IDS_RATE, parse_user
from quorum.managers import QuorumState
from records import ClientQuotaRecord, decode_batch, encode_batch
from tests.conftest import run, wait_for
from records.wire.errors import InvalidRequestError, InvariantViolation

NOW = 1_700_000_000_000
RATE = PRODUCER_IDS_RATE


def alter(state: QuorumState, user, value=0.0, remove=False, key=RATE):
    records, changed = state.quotas.generate_alter(user, key, value, remove, NOW)
    outcomes = state.apply_batch(records)
    assert all(o.accepted for o in outcomes), outcomes
    return records, changed


def test_set_user_and_default_then_resolution():
    s = QuorumState()
    (rec,), changed = alter(s, "alice", 5)
    assert changed and rec == ClientQuotaRecord(user="alice", key=RATE, value=5.0, remove=False, timestamp_ms=NOW)
    alter(s, None, 0.5)
    assert s.quotas.effective("alice", RATE) == (5.0, "user")
    assert s.quotas.effective("bob", RATE) == (0.5, "default")
    assert s.quotas.entries() == [{"user": None, "values": {RATE: 0.5}}, {"user": "alice", "values": {RATE: 5.0}}]


def test_no_quota_means_unlimited_and_delete_lifts_it():
    s = QuorumState()
    assert s.quotas.effective("alice", RATE) == (None, None)
    alter(s, "alice", 2)
    (rec,), changed = alter(s, "alice", remove=True)
    assert changed and rec.remove
    assert s.quotas.effective("alice", RATE) == (None, None) and s.quotas.entries() == []


def test_unchanged_and_absent_commit_nothing():
    s = QuorumState()
    alter(s, "alice", 2)
    assert alter(s, "alice", 2.0) == ([], False)
    assert alter(s, "bob", remove=True) == ([], False)


def test_user_principal_prefix_is_the_same_user():
    s = QuorumState()
    alter(s, "User:alice", 3)
    assert s.quotas.effective("alice", RATE) == (3.0, "user")
    assert alter(s, "alice", 3) == ([], False)


@pytest.mark.parametrize("value,fragment", [
    (-1, "is not in (0,"), (0, "is not in (0,"), (math.inf, "must be finite"), (-math.inf, "must be finite"),
    (math.nan, "must be finite"), (2e6, "is not in (0,"), ("3", "must be a number"), (True, "must be a number"),
])
def test_bad_rates_are_refused_with_a_reason(value, fragment):
    s = QuorumState()
    with pytest.raises(InvalidRequestError, match=fragment.replace("(", r"\(")):
        s.quotas.generate_alter("alice", RATE, value, False, NOW)
    assert s.quotas.entries() == []


@pytest.mark.parametrize("user,fragment", [
    ("", "bad user name"), ("al ice", "bad user name"), ("Group:ops", "unknown principal type 'Group:'"),
    ("User:", "bad user name"), ("a,b", "bad user name"), ("x" * 256, "bad user name"),
    ("<default>", "use the default entity"), (5, "must be a string"), ("ünï", "bad user name"),
])
def test_bad_user_syntax_is_refused(user, fragment):
    with pytest.raises(InvalidRequestError, match=fragment):
        QuorumState().quotas.generate_alter(user, RATE, 1.0, False, NOW)


def test_unknown_key_is_refused():
    with pytest.raises(InvalidRequestError, match="unknown quota key 'producer_byte_rate'"):
        QuorumState().quotas.generate_alter("a", "producer_byte_rate", 1.0, False, NOW)
    with pytest.raises(InvalidRequestError, match="unknown quota key"):
        QuorumState().quotas.generate_alter("a", "nope", 0.0, True, NOW)


def test_parse_user():
    assert parse_user(None) is None
    assert parse_user("User:ANONYMOUS") == "ANONYMOUS"
    assert parse_user("svc.orders@EXAMPLE.COM") == "svc.orders@EXAMPLE.COM"


@pytest.mark.parametrize("rec,fragment", [
    (ClientQuotaRecord(user="a", key=RATE, value=-1.0), "is not in"),
    (ClientQuotaRecord(user="a", key=RATE, value=math.nan), "must be finite"),
    (ClientQuotaRecord(user="a b", key=RATE, value=1.0), "bad user name"),
    (ClientQuotaRecord(user="a", key="nope", value=1.0), "unknown quota key"),
    (ClientQuotaRecord(user="a", key=RATE, remove=True), "is not set for User:a"),
])
def test_replay_refuses_records_that_break_invariants(rec, fragment):
    s = QuorumState()
    (outcome,) = s.apply_batch([rec])
    assert not outcome.accepted and fragment in outcome.error
    assert s.quotas.entries() == []
    with pytest.raises(InvariantViolation):
        s.replay(rec)


def test_snapshot_is_the_live_quotas_as_records_and_replays_to_the_same_state():
    s = QuorumState()
    alter(s, "alice", 5)
    alter(s, None, 0.25)
    alter(s, "bob", 1)
    alter(s, "bob", remove=True)
    snap = s.snapshot_records()
    quota_recs = [r for r in snap if isinstance(r, ClientQuotaRecord)]
    assert quota_recs == [ClientQuotaRecord(user=None, key=RATE, value=0.25),
                          ClientQuotaRecord(user="alice", key=RATE, value=5.0)]
    restored = QuorumState.from_records(decode_batch(encode_batch(snap)))
    assert restored.quotas == s.quotas
    assert restored.summary()["client_quotas"] == s.summary()["client_quotas"]


def test_fork_does_not_share_quota_state():
    s = QuorumState()
    alter(s, "alice", 5)
    scratch = s.fork()
    alter(scratch, "alice", 7)
    assert s.quotas.effective("alice", RATE) == (5.0, "user")


# ----------------------------------------------------------------- against a real quorum


def test_alter_and_describe_through_the_quorum_survive_a_snapshot_and_restart(cluster):
    async def go():
        c = cluster.client()
        try:
            assert await c.alter_client_quota("alice", RATE, 5) is True
            assert await c.alter_client_quota(None, RATE, 0.5) is True
            assert await c.alter_client_quota("alice", RATE, 5) is False
            assert await c.alter_client_quota("carol", RATE, 9, validate_only=True) is True
            with pytest.raises(InvalidRequestError, match="must be finite"):
                await c.alter_client_quota("alice", RATE, math.inf)
            with pytest.raises(InvalidRequestError, match="unknown principal type"):
                await c.alter_client_quota("Group:x", RATE, 1)
            entries, _ = await c.describe_client_quotas()
            return entries
        finally:
            await c.close()

    entries = run(go())
    assert entries == [{"user": None, "values": {RATE: 0.5}}, {"user": "alice", "values": {RATE: 5.0}}]

    # Every node has applied it, also after a snapshot and a restart (its own state, not the leader's answer).
    leader = cluster.leader()
    run(_snapshot(cluster, leader))
    cluster.lc.stop(leader)
    cluster.lc.start(leader)
    cluster.lc.wait_ready([leader])
    wait_for(lambda: cluster.describe_all().get(leader, {}).get("state", {}).get("client_quotas") == entries, 15,
             what="the restarted node to hold the quotas")


def test_a_read_through_a_follower_sees_the_change_answered_just_before(cluster):
    """A follower learns a commit a few milliseconds after the leader answered it: quota and ACL reads are the
    leader's (a follower forwards them), so a client that changed something reads its change anywhere."""
    leader = cluster.leader()
    follower = next(n.client_address for n in cluster.lc.nodes() if n.node_id != leader)

    async def go():
        writer = cluster.client()
        reader = QuorumClient([follower], RetryPolicy(timeout=10, attempt_timeout=2))
        try:
            for i in range(1, 21):
                assert await writer.alter_client_quota("alice", RATE, i) is True
                entries, _ = await reader.describe_client_quotas()
                assert entries == [{"user": "alice", "values": {RATE: float(i)}}], (i, entries)
        finally:
            await writer.close()
            await reader.close()
    run(go())


async def _snapshot(cluster, node_id):
    c = cluster.client()
    try:
        address = next(n.client_address for n in cluster.lc.nodes() if n.node_id == node_id)
        await c.describe(address, action="snapshot")
    finally:
        await c.close()
