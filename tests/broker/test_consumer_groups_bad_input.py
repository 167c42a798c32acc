"""Consumer-group requests built by hand against a broker process: a whole classic-protocol round (KIP-394's
member id, join, sync, heartbeat, leave) as a control, then bad input, each answered with Kafka's code (and only
where Kafka gives it: a partition's code for that partition alone), and the broker still serving afterwards."""
from __future__ import annotations

import datetime

import pytest
from confluent_kafka import Producer

from tests.broker.conftest import metered_broker
from tests.support.kafka_requests import entity, request_once
from records.wire import kafka
from records.wire.errors import Errors

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
LIST_GROUPS, DELETE_GROUPS = 16, 42
TOPIC = "cg-bad"
SESSION_MS = 10_000


@pytest.fixture(scope="module")
def broker(module_quorum):
    for b in metered_broker(module_quorum, 1, "--partitions", "2", "--group-initial-rebalance-delay-ms", "0"):
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce(TOPIC, value=b"x", partition=0)
        assert p.flush(20) == 0
        yield b


def call(b, api_key: int, version: int, **fields):
    return request_once(b.bootstrap, "cg-bad-input", kafka.request_entity(api_key, version, **fields))


def ms(n: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=n)


def join(b, group: str, member_id: str = "", protocols=(("range", b"\x00\x01"),), session_ms: int = SESSION_MS,
         version: int = 9, protocol_type: str = "consumer", instance_id: str | None = None):
    fields = dict(group_id=group, session_timeout=ms(session_ms), member_id=member_id, protocol_type=protocol_type,
                  protocols=tuple(entity(JOIN_GROUP, version, "JoinGroupRequestProtocol", name=n, metadata=m)
                                  for n, m in protocols))
    if version >= 1:
        fields["rebalance_timeout"] = ms(5_000)
    if version >= 5:
        fields["group_instance_id"] = instance_id
    if version >= 8:
        fields["reason"] = None
    return call(b, JOIN_GROUP, version, **fields)


def sync(b, group: str, member_id: str, generation: int, assignments: dict[str, bytes] | None = None):
    return call(b, SYNC_GROUP, 5, group_id=group, generation_id=generation, member_id=member_id,
                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                assignments=tuple(entity(SYNC_GROUP, 5, "SyncGroupRequestAssignment", member_id=m, assignment=a)
                                  for m, a in (assignments or {}).items()))


def heartbeat(b, group: str, member_id: str, generation: int) -> Errors:
    r = call(b, HEARTBEAT, 4, group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None)
    return Errors(int(r.error_code))


def commit(b, group: str, offsets: list[tuple[str, int, int, str | None]], generation: int = -1,
           member_id: str = "") -> dict[tuple[str, int], Errors]:
    by_topic: dict[str, list] = {}
    for topic, partition, offset, metadata in offsets:
        by_topic.setdefault(topic, []).append(entity(
            OFFSET_COMMIT, 8, "OffsetCommitRequestPartition", partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata=metadata))
    r = call(b, OFFSET_COMMIT, 8, group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
             group_instance_id=None, topics=tuple(entity(OFFSET_COMMIT, 8, "OffsetCommitRequestTopic", name=t,
                                                         partitions=tuple(ps)) for t, ps in by_topic.items()))
    return {(str(t.name), int(p.partition_index)): Errors(int(p.error_code)) for t in r.topics for p in t.partitions}


def fetch_v8(b, groups: dict[str, list[tuple[str, int]] | None]) -> dict[str, tuple[Errors, dict]]:
    """OffsetFetch v8: per group, (its error, {(topic, partition): (offset, metadata, error)})."""
    def topics(tps):
        if tps is None:
            return None
        by: dict[str, list[int]] = {}
        for t, p in tps:
            by.setdefault(t, []).append(p)
        return tuple(entity(OFFSET_FETCH, 8, "OffsetFetchRequestTopics", name=t, partition_indexes=tuple(ps))
                     for t, ps in by.items())
    asked = tuple(entity(OFFSET_FETCH, 8, "OffsetFetchRequestGroup", group_id=g, topics=topics(tps))
                  for g, tps in groups.items())
    r = call(b, OFFSET_FETCH, 8, require_stable=False, groups=asked)
    return {str(g.group_id): (Errors(int(g.error_code)), {
        (str(t.name), int(p.partition_index)): (int(p.committed_offset), p.metadata, Errors(int(p.error_code)))
        for t in g.topics for p in t.partitions}) for g in r.groups}


def delete(b, *groups: str) -> dict[str, Errors]:
    r = call(b, DELETE_GROUPS, 2, groups_names=tuple(groups))
    return {str(x.group_id): Errors(int(x.error_code)) for x in r.results}


def assert_serves(b) -> None:
    """The broker answers the next request (ListGroups) and logged no traceback."""
    r = call(b, LIST_GROUPS, 4, states_filter=())
    assert int(r.error_code) == 0
    assert "Traceback" not in b.log() and "UNKNOWN_SERVER_ERROR" not in b.log()


# ------------------------------------------------------------ the control: a whole round by hand
def test_a_whole_round_by_hand(broker):
    g = "raw-round"
    first = join(broker, g)
    assert Errors(int(first.error_code)) == Errors.MEMBER_ID_REQUIRED and first.member_id.startswith("cg-bad-input-")
    r = join(broker, g, member_id=first.member_id)
    assert Errors(int(r.error_code)) == Errors.NONE and r.generation_id == 1 and r.leader == r.member_id
    assert r.protocol_name == "range" and [(m.member_id, bytes(m.metadata)) for m in r.members] == [
        (first.member_id, b"\x00\x01")]
    s = sync(broker, g, r.member_id, 1, {r.member_id: b"mine"})
    assert Errors(int(s.error_code)) == Errors.NONE and bytes(s.assignment) == b"mine"
    assert heartbeat(broker, g, r.member_id, 1) == Errors.NONE
    assert commit(broker, g, [(TOPIC, 0, 1, "m")], generation=1, member_id=r.member_id) == {(TOPIC, 0): Errors.NONE}
    assert commit(broker, g, [(TOPIC, 0, 1, "m")], generation=0, member_id=r.member_id) == {
        (TOPIC, 0): Errors.ILLEGAL_GENERATION}
    assert delete(broker, g) == {g: Errors.NON_EMPTY_GROUP}
    leave = call(broker, LEAVE_GROUP, 5, group_id=g, members=(
        entity(LEAVE_GROUP, 5, "MemberIdentity", member_id=r.member_id, group_instance_id=None, reason=None),
        entity(LEAVE_GROUP, 5, "MemberIdentity", member_id="stranger", group_instance_id=None, reason=None)))
    assert int(leave.error_code) == 0
    assert [Errors(int(m.error_code)) for m in leave.members] == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID]
    assert heartbeat(broker, g, r.member_id, 1) == Errors.UNKNOWN_MEMBER_ID
    assert delete(broker, g) == {g: Errors.NONE}
    assert fetch_v8(broker, {g: [(TOPIC, 0)]})[g][1] == {(TOPIC, 0): (-1, "", Errors.NONE)}
    assert_serves(broker)


# ------------------------------------------------------------ JoinGroup
@pytest.mark.parametrize("version", [0, 5, 9])
def test_join_with_an_empty_group_id_is_invalid_group_id(broker, version):
    r = join(broker, "", version=version)
    assert Errors(int(r.error_code)) == Errors.INVALID_GROUP_ID and r.generation_id == -1
    assert_serves(broker)


@pytest.mark.parametrize("session_ms", [0, 1, 5_999, 1_800_001, 2**31 - 1])
def test_join_with_a_session_timeout_out_of_range_is_invalid_session_timeout(broker, session_ms):
    r = join(broker, "raw-session", session_ms=session_ms)
    assert Errors(int(r.error_code)) == Errors.INVALID_SESSION_TIMEOUT
    assert_serves(broker)


@pytest.mark.parametrize("protocols, protocol_type", [((), "consumer"), ((("range", b""),), "")],
                         ids=["no-protocols", "no-protocol-type"])
def test_join_with_no_protocols_is_inconsistent_group_protocol(broker, protocols, protocol_type):
    r = join(broker, "raw-protocols", protocols=protocols, protocol_type=protocol_type, version=3)
    assert Errors(int(r.error_code)) == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert_serves(broker)


def test_join_with_an_unknown_member_id_is_unknown_member_id(broker):
    for group in ("raw-unknown-member", "raw-round-2"):
        r = join(broker, group, member_id="i-made-this-up")
        assert Errors(int(r.error_code)) == Errors.UNKNOWN_MEMBER_ID
    # a group that exists: still unknown
    first = join(broker, "raw-round-2")
    join(broker, "raw-round-2", member_id=first.member_id)
    r = join(broker, "raw-round-2", member_id="i-made-this-up-too")
    assert Errors(int(r.error_code)) == Errors.UNKNOWN_MEMBER_ID
    assert_serves(broker)


def test_join_with_a_protocol_the_group_does_not_run_is_inconsistent(broker):
    g = "raw-inconsistent"
    first = join(broker, g, version=3)  # v3: no member id round
    assert Errors(int(first.error_code)) == Errors.NONE and first.generation_id == 1
    other = join(broker, g, protocols=(("roundrobin", b""),), version=3)
    assert Errors(int(other.error_code)) == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert_serves(broker)


# ------------------------------------------------------------ SyncGroup, Heartbeat, LeaveGroup
def test_sync_and_heartbeat_for_an_unknown_group_are_unknown_member_id(broker):
    s = sync(broker, "raw-no-such-group", "m", 1, {"m": b"x"})
    assert Errors(int(s.error_code)) == Errors.UNKNOWN_MEMBER_ID and bytes(s.assignment) == b""
    assert heartbeat(broker, "raw-no-such-group", "m", 1) == Errors.UNKNOWN_MEMBER_ID
    assert heartbeat(broker, "", "m", 1) == Errors.INVALID_GROUP_ID
    s = sync(broker, "", "m", 1)
    assert Errors(int(s.error_code)) == Errors.INVALID_GROUP_ID
    leave = call(broker, LEAVE_GROUP, 0, group_id="raw-no-such-group", member_id="m")
    assert Errors(int(leave.error_code)) == Errors.UNKNOWN_MEMBER_ID
    assert_serves(broker)


# ------------------------------------------------------------ offsets
def test_offset_commit_refuses_only_the_bad_partitions(broker):
    g = "raw-offsets"
    big, limit = "x" * 4097, "y" * 4096
    got = commit(broker, g, [(TOPIC, 0, 7, big), (TOPIC, 1, 8, limit), ("no-such-topic", 0, 1, None),
                             (TOPIC, 99, 1, None)])
    assert got == {(TOPIC, 0): Errors.OFFSET_METADATA_TOO_LARGE, (TOPIC, 1): Errors.NONE,
                   ("no-such-topic", 0): Errors.UNKNOWN_TOPIC_OR_PARTITION,
                   (TOPIC, 99): Errors.UNKNOWN_TOPIC_OR_PARTITION}
    err, offsets = fetch_v8(broker, {g: None})[g]
    assert err == Errors.NONE and offsets == {(TOPIC, 1): (8, limit, Errors.NONE)}  # only the good one stored
    # metadata counted in UTF-8 bytes: 2049 two-byte characters are over
    assert commit(broker, g, [(TOPIC, 0, 3, "é" * 2049)]) == {(TOPIC, 0): Errors.OFFSET_METADATA_TOO_LARGE}
    assert commit(broker, g, [(TOPIC, 0, 3, "é" * 2048)]) == {(TOPIC, 0): Errors.NONE}
    assert_serves(broker)


def test_offset_commit_with_a_generation_to_a_group_without_members_is_illegal_generation(broker):
    assert commit(broker, "raw-no-members", [(TOPIC, 0, 1, None)], generation=3, member_id="m") == {
        (TOPIC, 0): Errors.ILLEGAL_GENERATION}
    assert_serves(broker)


def test_offset_fetch_v8_answers_several_groups(broker):
    a, b, unknown = "raw-fetch-a", "raw-fetch-b", "raw-fetch-unknown"
    assert commit(broker, a, [(TOPIC, 0, 10, "a0"), (TOPIC, 1, 11, None)]) == {(TOPIC, 0): Errors.NONE,
                                                                             (TOPIC, 1): Errors.NONE}
    assert commit(broker, b, [(TOPIC, 1, 21, "b1")]) == {(TOPIC, 1): Errors.NONE}
    got = fetch_v8(broker, {a: None, b: [(TOPIC, 0), (TOPIC, 1)], unknown: [(TOPIC, 0)]})
    assert got == {
        a: (Errors.NONE, {(TOPIC, 0): (10, "a0", Errors.NONE), (TOPIC, 1): (11, "", Errors.NONE)}),
        b: (Errors.NONE, {(TOPIC, 0): (-1, "", Errors.NONE), (TOPIC, 1): (21, "b1", Errors.NONE)}),
        unknown: (Errors.NONE, {(TOPIC, 0): (-1, "", Errors.NONE)}),
    }
    assert_serves(broker)


# ------------------------------------------------------------ DeleteGroups
def test_delete_groups_of_unknown_names(broker):
    assert commit(broker, "raw-delete-me", [(TOPIC, 0, 1, None)]) == {(TOPIC, 0): Errors.NONE}
    got = delete(broker, "raw-never-existed", "raw-delete-me")
    assert got == {"raw-never-existed": Errors.GROUP_ID_NOT_FOUND, "raw-delete-me": Errors.NONE}
    assert delete(broker, "raw-delete-me") == {"raw-delete-me": Errors.GROUP_ID_NOT_FOUND}
    assert fetch_v8(broker, {"raw-delete-me": None})["raw-delete-me"] == (Errors.NONE, {})
    assert_serves(broker)


# ------------------------------------------------------------ the empty group id


def test_offset_commit_and_fetch_accept_the_empty_group_id(broker):
    """Kafka keeps offsets of the group "" (OffsetCommit, OffsetFetch: ``groupId != null``, for backward
    compatibility); only JoinGroup, SyncGroup, Heartbeat and LeaveGroup need a non-empty id."""
    try:
        assert commit(broker, "", [(TOPIC, 1, 6, "empty-id")]) == {(TOPIC, 1): Errors.NONE}
        assert fetch_v8(broker, {"": [(TOPIC, 1)]})[""] == (Errors.NONE, {(TOPIC, 1): (6, "empty-id", Errors.NONE)})
    finally:
        assert_serves(broker)


def test_describe_and_delete_groups_accept_the_empty_group_id(broker):
    """DescribeGroups of "" is a group like any other (Empty with offsets, Dead when it has nothing); DeleteGroups
    of "" deletes it, then is GROUP_ID_NOT_FOUND, never INVALID_GROUP_ID."""
    try:
        assert commit(broker, "", [(TOPIC, 1, 7, None)]) == {(TOPIC, 1): Errors.NONE}
        (g,) = call(broker, 15, 5, groups=("",), include_authorized_operations=False).groups
        assert (Errors(int(g.error_code)), g.group_state) == (Errors.NONE, "Empty")
        assert delete(broker, "") == {"": Errors.NONE}
        (g,) = call(broker, 15, 5, groups=("",), include_authorized_operations=False).groups
        assert (Errors(int(g.error_code)), g.group_state) == (Errors.NONE, "Dead")
        assert delete(broker, "") == {"": Errors.GROUP_ID_NOT_FOUND}
    finally:
        assert_serves(broker)
