"""ACL matching and the ACL slice of the quorum state machine (no Raft, no network)."""
from __future__ import annotations

import itertools

import pytest

from quorum.managers import AclManager, QuorumState
from records import AclRecord, RemoveAclRecord
from quorum.security.acl import (
    ALL,
    ALLOW,
    ALTER,
    CLUSTER,
    CLUSTER_ACTION,
    CLUSTER_NAME,
    DENY,
    DESCRIBE,
    IDEMPOTENT_WRITE,
    LITERAL,
    PREFIXED,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    Acl,
    AclError,
    AclIndex,
    authorize,
)
from records.wire.errors import InvalidRequestError

ALICE, BOB = "User:alice", "User:bob"


def tx(principal, name, op=WRITE, perm=ALLOW, pattern=LITERAL, host="*"):
    return Acl(principal, TRANSACTIONAL_ID, name, pattern, op, perm, host)


def cl(principal, op, perm=ALLOW):
    return Acl(principal, CLUSTER, CLUSTER_NAME, LITERAL, op, perm)


def test_literal_prefixed_and_wildcard_names():
    acls = [tx(ALICE, "orders"), tx(ALICE, "pay-", pattern=PREFIXED), tx(BOB, "*")]
    assert authorize(acls, ALICE, TRANSACTIONAL_ID, "orders", WRITE)
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "orders-2", WRITE)  # literal is exact
    assert authorize(acls, ALICE, TRANSACTIONAL_ID, "pay-1", WRITE)
    assert authorize(acls, ALICE, TRANSACTIONAL_ID, "pay-", WRITE)
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "pa", WRITE)
    assert authorize(acls, BOB, TRANSACTIONAL_ID, "anything", WRITE)
    assert not authorize(acls, "User:carol", TRANSACTIONAL_ID, "orders", WRITE)
    # an entry for one resource type never matches another
    assert not authorize([tx(ALICE, "pay-", pattern=PREFIXED)], ALICE, CLUSTER, CLUSTER_NAME, WRITE)


def test_wildcard_principal_and_deny_wins():
    acls = [tx("User:*", "*"), tx(ALICE, "secret-", perm=DENY, pattern=PREFIXED)]
    assert authorize(acls, BOB, TRANSACTIONAL_ID, "secret-1", WRITE)
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "secret-1", WRITE)
    assert authorize(acls, ALICE, TRANSACTIONAL_ID, "public", WRITE)
    # deny on ALL denies every operation, even with an explicit allow of that operation
    acls = [cl(ALICE, IDEMPOTENT_WRITE), cl(ALICE, ALL, DENY)]
    assert not authorize(acls, ALICE, CLUSTER, CLUSTER_NAME, IDEMPOTENT_WRITE)
    # deny of another operation does not deny this one
    acls = [cl(ALICE, IDEMPOTENT_WRITE), cl(ALICE, CLUSTER_ACTION, DENY)]
    assert authorize(acls, ALICE, CLUSTER, CLUSTER_NAME, IDEMPOTENT_WRITE)
    # a deny for everyone beats an allow for one
    acls = [tx(ALICE, "orders"), tx("User:*", "orders", perm=DENY)]
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "orders", WRITE)


def test_operations_all_implied_describe_and_super_users():
    assert authorize([cl(ALICE, ALL)], ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION)
    assert authorize([cl(ALICE, ALTER)], ALICE, CLUSTER, CLUSTER_NAME, DESCRIBE)
    assert not authorize([cl(ALICE, DESCRIBE)], ALICE, CLUSTER, CLUSTER_NAME, ALTER)
    assert not authorize([cl(ALICE, IDEMPOTENT_WRITE)], ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION)
    assert not authorize([], ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION)  # no ACL found: denied
    assert authorize([cl(ALICE, ALL, DENY)], ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION, super_users=[ALICE])


def test_host_matching():
    acls = [tx(ALICE, "orders", host="10.0.0.7")]
    assert authorize(acls, ALICE, TRANSACTIONAL_ID, "orders", WRITE, host="10.0.0.7")
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "orders", WRITE, host="10.0.0.8")
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "orders", WRITE, host=None)


@pytest.mark.parametrize("acl,fragment", [
    (Acl("alice", TRANSACTIONAL_ID, "x", LITERAL, WRITE, ALLOW), "User:<name>"),
    (Acl("User:", TRANSACTIONAL_ID, "x", LITERAL, WRITE, ALLOW), "User:<name>"),
    (Acl(ALICE, "DelegationToken", "x", LITERAL, WRITE, ALLOW), "resource type"),
    (Acl(ALICE, "Group", "x", LITERAL, WRITE, ALLOW), "does not apply to Group"),
    (Acl(ALICE, CLUSTER, "other", LITERAL, CLUSTER_ACTION, ALLOW), "kafka-cluster"),
    (Acl(ALICE, TRANSACTIONAL_ID, "*", PREFIXED, WRITE, ALLOW), "PREFIXED"),
    (Acl(ALICE, TRANSACTIONAL_ID, "", LITERAL, WRITE, ALLOW), "empty"),
    (Acl(ALICE, TRANSACTIONAL_ID, "x", LITERAL, CLUSTER_ACTION, ALLOW), "does not apply"),
    (Acl(ALICE, TRANSACTIONAL_ID, "x", "MATCH", WRITE, ALLOW), "pattern type"),
    (Acl(ALICE, TRANSACTIONAL_ID, "x", LITERAL, WRITE, "MAYBE"), "ALLOW or DENY"),
])
def test_invalid_entries_are_refused(acl, fragment):
    with pytest.raises(AclError, match=fragment):
        acl.validate()
    with pytest.raises(InvalidRequestError, match=fragment):
        AclManager().generate_alter("add", acl, 1)


def test_manager_generate_and_replay():
    m = AclManager()
    acl = tx(ALICE, "orders-", pattern=PREFIXED)
    res = m.generate_alter("add", acl, 1234)
    assert res.response is True and len(res.records) == 1
    rec = res.records[0]
    assert isinstance(rec, AclRecord) and rec.timestamp_ms == 1234 and Acl.from_obj(rec) == acl
    assert m.acls() == []  # generate changes nothing
    m.replay(rec)
    assert m.acls() == [acl]
    again = m.generate_alter("add", acl, 1300)
    assert again.records == [] and again.response is False
    assert m.generate_alter("remove", tx(BOB, "x"), 1).response is False
    rm = m.generate_alter("remove", acl, 1400)
    assert isinstance(rm.records[0], RemoveAclRecord)
    m.replay(rm.records[0])
    assert m.acls() == []
    with pytest.raises(InvalidRequestError, match="unknown ACL action"):
        m.generate_alter("grant", acl, 1)


def test_replay_refuses_duplicates_missing_and_invalid_records():
    state = QuorumState()
    rec = AclRecord(**tx(ALICE, "orders").to_dict(), timestamp_ms=1)
    rm = RemoveAclRecord(**tx(ALICE, "orders").to_dict(), timestamp_ms=2)
    bad = AclRecord(**tx(ALICE, "orders", op="EXPLODE").to_dict(), timestamp_ms=3)
    out = state.apply_batch([rm, rec, rec, bad])
    assert [o.accepted for o in out] == [False, True, False, False]
    assert "does not exist" in out[0].error and "already exists" in out[2].error and "invalid" in out[3].error
    assert state.acls.acls() == [tx(ALICE, "orders")]


def test_acls_survive_a_snapshot_and_fork_is_independent():
    state = QuorumState()
    acls = [cl("User:broker", CLUSTER_ACTION), tx(ALICE, "pay-", pattern=PREFIXED), tx("User:*", "x", perm=DENY)]
    state.apply_batch([AclRecord(**a.to_dict(), timestamp_ms=i) for i, a in enumerate(acls)])
    records = state.snapshot_records()
    restored = QuorumState.from_records(records)
    assert restored.acls.acls() == sorted(acls)
    scratch = state.fork()
    scratch.apply_batch(scratch.acls.generate_alter("remove", acls[0], 9).records)
    assert len(scratch.acls.acls()) == 2 and len(state.acls.acls()) == 3


def test_index_gives_the_same_answers_as_the_list():
    acls = [tx(ALICE, "orders"), tx(ALICE, "pay-", pattern=PREFIXED), tx("User:*", "shared"),
            tx("User:*", "secret-", perm=DENY, pattern=PREFIXED), tx(BOB, "*"), cl(ALICE, IDEMPOTENT_WRITE),
            cl("User:*", CLUSTER_ACTION, DENY), cl(BOB, ALL)]
    index = AclIndex(acls)
    for principal, (rtype, name), op in itertools.product(
            [ALICE, BOB, "User:carol", "User:*"],
            [(TRANSACTIONAL_ID, n) for n in ("orders", "pay-1", "shared", "secret-x", "other")]
            + [(CLUSTER, CLUSTER_NAME)],
            [WRITE, IDEMPOTENT_WRITE, CLUSTER_ACTION, DESCRIBE]):
        assert index.authorize(principal, rtype, name, op) == authorize(acls, principal, rtype, name, op), \
            (principal, name, op)
    assert index.authorize("User:carol", CLUSTER, CLUSTER_NAME, CLUSTER_ACTION, super_users={"User:carol"})


def test_manager_index_follows_replay():
    state = QuorumState()
    assert not state.acls.index().authorize(ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION)
    state.apply_batch([AclRecord(**cl(ALICE, CLUSTER_ACTION).to_dict(), timestamp_ms=1)])
    assert state.acls.index().authorize(ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION)
    state.apply_batch([RemoveAclRecord(**cl(ALICE, CLUSTER_ACTION).to_dict(), timestamp_ms=2)])
    assert not state.acls.index().authorize(ALICE, CLUSTER, CLUSTER_NAME, CLUSTER_ACTION)


def test_topic_entries_and_implied_describe():
    acls = [Acl(ALICE, TOPIC, "orders-", PREFIXED, WRITE, ALLOW), Acl(BOB, TOPIC, "*", LITERAL, READ, ALLOW),
            Acl(BOB, TOPIC, "secret", LITERAL, DESCRIBE, DENY)]
    for acl in acls:
        acl.validate()
    assert authorize(acls, ALICE, TOPIC, "orders-1", DESCRIBE)  # WRITE implies DESCRIBE
    assert not authorize(acls, ALICE, TOPIC, "payments", DESCRIBE)
    assert authorize(acls, BOB, TOPIC, "orders-1", DESCRIBE)  # so does READ
    assert not authorize(acls, BOB, TOPIC, "secret", DESCRIBE)  # a DENY wins
    # a topic entry is not a transactional-id entry of the same name
    assert not authorize(acls, ALICE, TRANSACTIONAL_ID, "orders-1", WRITE)
    with pytest.raises(AclError, match="does not apply"):
        Acl(ALICE, TOPIC, "t", LITERAL, IDEMPOTENT_WRITE, ALLOW).validate()
