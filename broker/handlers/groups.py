"""Consumer groups (classic protocol) and their committed offsets: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups and TxnOffsetCommit, each read from its
request and answered in its version's layout; the rules are ``broker.groups``' (docs/consumer-groups.md).
FindCoordinator names this broker for a group (``handlers.metadata``); AddOffsetsToTxn is in
``handlers.transactions``."""
from __future__ import annotations

import logging
from typing import Any

from quorum.security import acl as acls
from records.wire import kafka
from records.wire.errors import CoordinatorLoadInProgressError, Errors, PidQuorumError

from .. import kafkaio as kio_
from ..config import BrokerConfig
from ..groups.coordinator import GroupCoordinator, OffsetIn
from ..groups.membership import GroupError
from .context import BrokerContext
from .rpc import BrokerRpc

log = logging.getLogger("broker.frontend")

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, TXN_OFFSET_COMMIT, DELETE_GROUPS = 15, 16, 28, 42
BATCHED_OFFSET_FETCH = 8  # OffsetFetch v8 (KIP-709): several groups per request
NO_AUTHORIZED_OPERATIONS = -2147483648  # Kafka's answer when they were not asked for
# READ, DELETE and DESCRIBE (AclOperation codes 3, 6, 8): what may be done to a group (KIP-430)
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


def coordinator(server: BrokerContext) -> GroupCoordinator:
    if server.groups is None:
        raise CoordinatorLoadInProgressError("the broker is starting")
    return server.groups


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)


def _group_allowed(server: BrokerContext, req: kafka.Request, group: Any, operation: str) -> bool:
    """May ``req``'s principal do ``operation`` on consumer group ``group`` (Kafka's GROUP ACLs)?  Always with
    SASL off.  A refusal is counted."""
    if server.acls is None or server.acls.authorize(req.principal, acls.GROUP, str(group), operation, req.host):
        return True
    server.counters["authorization_failures"] += 1
    log.info("%s is not allowed %s on group %r (answered GROUP_AUTHORIZATION_FAILED)", req.principal, operation,
             str(group)[:200])
    return False


def _check_read(server: BrokerContext, req: kafka.Request, group: Any) -> None:
    """READ on the group (joining, heartbeats, offsets), else the whole request is GROUP_AUTHORIZATION_FAILED."""
    if not _group_allowed(server, req, group, acls.READ):
        raise GroupError(Errors.GROUP_AUTHORIZATION_FAILED, f"{req.principal} may not READ group {str(group)[:200]!r}")


def _refused(api: str, group: Any, e: GroupError) -> Errors:
    log.debug("%s %r: %s (answered %s)", api, str(group)[:200], e.message, e.code.name)
    return e.code


# ------------------------------------------------------------ membership
async def join_group(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    session_ms = kio_.ms(b.session_timeout)
    rebalance_ms = kio_.ms(getattr(b, "rebalance_timeout", None)) if v >= 1 else session_ms
    protocols = [(str(p.name), bytes(p.metadata)) for p in b.protocols]
    member_id = str(b.member_id)
    body: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "generation_id": -1, "protocol_type": None,
                            "protocol_name": None if v >= 7 else "", "leader": "", "skip_assignment": False,
                            "member_id": member_id, "members": []}
    try:
        _check_read(server, req, b.group_id)
        r = await coordinator(server).join(
            b.group_id, member_id, _opt(getattr(b, "group_instance_id", None)), req.client_id or "",
            req.host or "", session_ms, rebalance_ms, str(b.protocol_type), protocols, v >= 4)
    except GroupError as e:
        body["error_code"] = int(_refused("JoinGroup", b.group_id, e))
        return kio_.response(JOIN_GROUP, v, body)
    body.update(error_code=int(r.error), generation_id=r.generation, member_id=r.member_id, leader=r.leader,
                protocol_type=r.protocol_type, protocol_name=r.protocol if (v >= 7 or r.protocol) else "",
                members=[{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in r.members])
    return kio_.response(JOIN_GROUP, v, body)


async def sync_group(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    body: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "protocol_type": None, "protocol_name": None,
                            "assignment": b""}
    try:
        _check_read(server, req, b.group_id)
        assignment, ptype, protocol = await coordinator(server).sync(
            b.group_id, str(b.member_id), _opt(getattr(b, "group_instance_id", None)), int(b.generation_id),
            _opt(getattr(b, "protocol_type", None)), _opt(getattr(b, "protocol_name", None)),
            {str(a.member_id): bytes(a.assignment) for a in b.assignments})
        body.update(assignment=assignment, protocol_type=ptype, protocol_name=protocol)
    except GroupError as e:
        body["error_code"] = int(_refused("SyncGroup", b.group_id, e))
    return kio_.response(SYNC_GROUP, v, body)


def heartbeat(server: BrokerContext, req: kafka.Request) -> Any:
    b = req.body
    try:
        _check_read(server, req, b.group_id)
        code = coordinator(server).heartbeat(b.group_id, str(b.member_id),
                                             _opt(getattr(b, "group_instance_id", None)), int(b.generation_id))
    except GroupError as e:
        code = _refused("Heartbeat", b.group_id, e)
    return kio_.response(HEARTBEAT, req.api_version, {"throttle_time": 0, "error_code": int(code)})


def leave_group(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    members = ([(str(m.member_id), _opt(m.group_instance_id)) for m in b.members] if v >= 3
               else [(str(b.member_id), None)])
    try:
        _check_read(server, req, b.group_id)
        codes = coordinator(server).leave(b.group_id, members)
    except GroupError as e:
        return kio_.response(LEAVE_GROUP, v, {"throttle_time": 0, "error_code": int(e.code), "members": []})
    if v < 3:
        return kio_.response(LEAVE_GROUP, v, {"throttle_time": 0, "error_code": int(codes[0])})
    return kio_.response(LEAVE_GROUP, v, {"throttle_time": 0, "error_code": 0, "members": [
        {"member_id": m, "group_instance_id": i, "error_code": int(c)} for (m, i), c in zip(members, codes)]})


# ------------------------------------------------------------ offsets
def _offsets_in(topics: Any) -> list[OffsetIn]:
    return [OffsetIn(str(t.name), int(p.partition_index), int(p.committed_offset),
                     int(getattr(p, "committed_leader_epoch", -1)), _opt(p.committed_metadata))
            for t in topics for p in t.partitions]


def _per_partition(api: int, version: int, topics: Any, code_of: Any) -> Any:
    return kio_.response(api, version, {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": int(code_of(str(t.name), int(p.partition_index)))}
            for p in t.partitions]} for t in topics]})


def _topics_allowed(server: BrokerContext, req: kafka.Request, topics: Any) -> set[str]:
    """The topics of ``topics`` the principal may not READ (SASL on), as Kafka checks offsets' topics."""
    return {str(t.name) for t in topics if not server._topic_allowed(req, str(t.name))}


async def offset_commit(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    refused = _topics_allowed(server, req, b.topics)
    offsets = [o for o in _offsets_in(b.topics) if o.topic not in refused]
    try:
        _check_read(server, req, b.group_id)
        errors = await coordinator(server).commit(b.group_id, int(b.generation_id_or_member_epoch), str(b.member_id),
                                                  _opt(getattr(b, "group_instance_id", None)), offsets)
    except GroupError as e:
        code = _refused("OffsetCommit", b.group_id, e)
        return _per_partition(OFFSET_COMMIT, v, b.topics, lambda t, p: code)
    return _per_partition(OFFSET_COMMIT, v, b.topics, lambda t, p: Errors.TOPIC_AUTHORIZATION_FAILED
                          if t in refused else errors.get((t, p), Errors.NONE))


def _fetch_group(server: BrokerContext, req: kafka.Request, group_id: Any, topics: Any,
                 require_stable: bool) -> dict:
    """One group's OffsetFetch answer: {group_id, topics, error_code}."""
    if not _group_allowed(server, req, group_id, acls.READ):
        return {"group_id": group_id, "error_code": int(Errors.GROUP_AUTHORIZATION_FAILED), "topics": []}
    wanted = None if topics is None else [(str(t.name), int(i)) for t in topics for i in t.partition_indexes]
    refused = set() if topics is None else {str(t.name) for t in topics if not server._topic_allowed(req, str(t.name))}
    rows = coordinator(server).fetch(str(group_id), wanted, require_stable)
    by_topic: dict[str, list] = {}
    for topic, partition, c, code in rows:
        if topic in refused:
            code, c = Errors.TOPIC_AUTHORIZATION_FAILED, None
        elif topics is None and not server._topic_allowed(req, topic):
            continue  # every offset of the group: only those of topics the principal may read
        by_topic.setdefault(topic, []).append({
            "partition_index": partition, "error_code": int(code),
            "committed_offset": -1 if c is None else c.offset,
            "committed_leader_epoch": -1 if c is None else c.leader_epoch,
            "metadata": "" if c is None or c.metadata is None else c.metadata})
    return {"group_id": group_id, "error_code": 0,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}


def offset_fetch(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    stable = bool(getattr(b, "require_stable", False))
    if v >= BATCHED_OFFSET_FETCH:
        return kio_.response(OFFSET_FETCH, v, {"throttle_time": 0, "groups": [
            _fetch_group(server, req, g.group_id, g.topics, stable) for g in b.groups]})
    answer = _fetch_group(server, req, b.group_id, b.topics, stable)
    return kio_.response(OFFSET_FETCH, v, {"throttle_time": 0, "error_code": answer["error_code"],
                                           "topics": answer["topics"]})


async def txn_offset_commit(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    refused = _topics_allowed(server, req, b.topics)
    offsets = [o for o in _offsets_in(b.topics) if o.topic not in refused]
    try:
        _check_read(server, req, b.group_id)
        errors = await coordinator(server).txn_commit(
            str(b.transactional_id), b.group_id, int(b.producer_id), int(b.producer_epoch),
            int(getattr(b, "generation_id", -1)), str(getattr(b, "member_id", "")),
            _opt(getattr(b, "group_instance_id", None)), offsets)
    except (GroupError, PidQuorumError) as e:
        code = e.code if isinstance(e, PidQuorumError) else _refused("TxnOffsetCommit", b.group_id, e)
        if code == Errors.PRODUCER_FENCED and v < 3:
            code = Errors.INVALID_PRODUCER_EPOCH  # PRODUCER_FENCED exists from v3 on (KIP-588)
        log.info("TxnOffsetCommit %r for group %r: %s", str(b.transactional_id)[:200], str(b.group_id)[:200],
                 code.name)
        return _per_partition(TXN_OFFSET_COMMIT, v, b.topics, lambda t, p: code)
    return _per_partition(TXN_OFFSET_COMMIT, v, b.topics, lambda t, p: Errors.TOPIC_AUTHORIZATION_FAILED
                          if t in refused else errors.get((t, p), Errors.NONE))


# ------------------------------------------------------------ administration
def list_groups(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    states = {str(s).lower() for s in getattr(b, "states_filter", ())}
    types = {str(t).lower() for t in getattr(b, "types_filter", ())}
    everyone = server.acls is None or server.acls.authorize(req.principal, acls.CLUSTER, acls.CLUSTER_NAME,
                                                            acls.DESCRIBE, req.host)
    rows = [{"group_id": g, "protocol_type": ptype, "group_state": state, "group_type": "classic"}
            for g, ptype, state in coordinator(server).list_groups()
            if (not states or state.lower() in states) and (not types or "classic" in types)
            and (everyone or server.acls.authorize(req.principal, acls.GROUP, g, acls.DESCRIBE, req.host))]
    return kio_.response(LIST_GROUPS, v, {"throttle_time": 0, "error_code": 0, "groups": rows})


def describe_groups(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    ops = GROUP_OPERATIONS if getattr(b, "include_authorized_operations", False) else NO_AUTHORIZED_OPERATIONS
    out = []
    for name in b.groups:
        g = coordinator(server).describe(str(name))
        row: dict[str, Any] = {"error_code": 0, "group_id": name, "group_state": "Dead", "protocol_type": "",
                               "protocol_data": "", "members": [], "authorized_operations": ops}
        if not _group_allowed(server, req, name, acls.DESCRIBE):
            row["error_code"] = int(Errors.GROUP_AUTHORIZATION_FAILED)
        elif g is not None:
            stable = g.state == "Stable"
            row.update(group_state=g.state, protocol_type=g.protocol_type or "",
                       protocol_data=(g.protocol or "") if stable else "",
                       members=[{"member_id": m.member_id, "group_instance_id": m.instance_id,
                                 "client_id": m.client_id, "client_host": m.client_host,
                                 "member_metadata": m.metadata(g.protocol) if stable else b"",
                                 "member_assignment": m.assignment if stable else b""}
                                for m in g.members.values()])
        out.append(row)
    return kio_.response(DESCRIBE_GROUPS, v, {"throttle_time": 0, "groups": out})


async def delete_groups(server: BrokerContext, req: kafka.Request) -> Any:
    out = []
    for name in req.body.groups_names:
        if not _group_allowed(server, req, name, acls.DELETE):
            out.append({"group_id": name, "error_code": int(Errors.GROUP_AUTHORIZATION_FAILED)})
            continue
        code = await coordinator(server).delete(str(name))
        out.append({"group_id": name, "error_code": int(code)})
    return kio_.response(DELETE_GROUPS, req.api_version, {"throttle_time": 0, "results": out})


# ------------------------------------------------------------ error answers (shaped like the request)
def _join_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(JOIN_GROUP, version, {
        "throttle_time": 0, "error_code": int(code), "generation_id": -1, "protocol_type": None,
        "protocol_name": None if version >= 7 else "", "leader": "", "skip_assignment": False,
        "member_id": "" if body is None else str(body.member_id), "members": []})


def _sync_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(SYNC_GROUP, version, {"throttle_time": 0, "error_code": int(code), "protocol_type": None,
                                               "protocol_name": None, "assignment": b""})


def _code_only(api: int) -> Any:
    def error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
        return kio_.response(api, version, {"throttle_time": 0, "error_code": int(code), "members": [],
                                            "groups": []})
    return error


def _offset_commit_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return _per_partition(OFFSET_COMMIT, version, () if body is None else body.topics, lambda t, p: code)


def _txn_offset_commit_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    if code == Errors.PRODUCER_FENCED and version < 3:
        code = Errors.INVALID_PRODUCER_EPOCH
    return _per_partition(TXN_OFFSET_COMMIT, version, () if body is None else body.topics, lambda t, p: code)


def _offset_fetch_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    if version >= BATCHED_OFFSET_FETCH:
        groups = [] if body is None else [{"group_id": g.group_id, "error_code": int(code), "topics": []}
                                          for g in body.groups]
        return kio_.response(OFFSET_FETCH, version, {"throttle_time": 0, "groups": groups})
    return kio_.response(OFFSET_FETCH, version, {"throttle_time": 0, "error_code": int(code), "topics": []})


def _describe_groups_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    groups = [] if body is None else [
        {"error_code": int(code), "group_id": g, "group_state": "", "protocol_type": "", "protocol_data": "",
         "members": [], "authorized_operations": NO_AUTHORIZED_OPERATIONS} for g in body.groups]
    return kio_.response(DESCRIBE_GROUPS, version, {"throttle_time": 0, "groups": groups})


def _delete_groups_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    results = [] if body is None else [{"group_id": g, "error_code": int(code)} for g in body.groups_names]
    return kio_.response(DELETE_GROUPS, version, {"throttle_time": 0, "results": results})


RPCS: dict[int, BrokerRpc] = {
    JOIN_GROUP: BrokerRpc("JoinGroup", (0, 9), join_group, _join_error),
    SYNC_GROUP: BrokerRpc("SyncGroup", (0, 5), sync_group, _sync_error),
    HEARTBEAT: BrokerRpc("Heartbeat", (0, 4), heartbeat, _code_only(HEARTBEAT)),
    LEAVE_GROUP: BrokerRpc("LeaveGroup", (0, 5), leave_group, _code_only(LEAVE_GROUP)),
    # READ on each topic whose offsets are committed or fetched (Kafka's check; SASL on)
    OFFSET_COMMIT: BrokerRpc("OffsetCommit", (2, 8), offset_commit, _offset_commit_error, topic_acl=acls.READ),
    OFFSET_FETCH: BrokerRpc("OffsetFetch", (1, 8), offset_fetch, _offset_fetch_error, topic_acl=acls.READ),
    LIST_GROUPS: BrokerRpc("ListGroups", (0, 5), list_groups, _code_only(LIST_GROUPS)),
    DESCRIBE_GROUPS: BrokerRpc("DescribeGroups", (0, 5), describe_groups, _describe_groups_error),
    DELETE_GROUPS: BrokerRpc("DeleteGroups", (0, 2), delete_groups, _delete_groups_error),
    TXN_OFFSET_COMMIT: BrokerRpc("TxnOffsetCommit", (0, 3), txn_offset_commit, _txn_offset_commit_error,
                                 lambda b: (acls.TRANSACTIONAL_ID, str(b.transactional_id), acls.WRITE),
                                 topic_acl=acls.READ),
}
