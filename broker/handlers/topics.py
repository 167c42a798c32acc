"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs (topics), as Kafka answers them.

Every topic or resource of a request is answered on its own (an error code and a message), the others are
served; bad input of any kind is a per-topic error.  The disk work is ``broker.storage.Storage``'s (crash-safe
creation, growth and deletion; the topic configs it serves, ``TOPIC_CONFIGS``), run in an I/O thread.  What is
served and why: docs/brokers.md, "Topic administration".
"""
from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import Any

from quorum.security import acl as acls
from records.wire import kafka
from records.wire.errors import Errors, PidQuorumError

from .. import kafkaio as kio_
from ..config import BrokerConfig
from ..storage import (INVALID_CONFIG, INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICATION_FACTOR, MAX_TOPIC_PARTITIONS,
                       POLICY_VIOLATION, TOPIC_ALREADY_EXISTS, TOPIC_CONFIGS, TopicAdminError, TopicInfo,
                       check_reserved, parse_topic_configs, validate_topic_name)
from .context import BrokerContext
from .rpc import BrokerRpc

# The front end logs under one name, whichever of its modules writes the line (log settings name it).
log = logging.getLogger("broker.frontend")

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS = 19, 20, 32, 37
ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 33, 44
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4  # DescribeConfigs' resource types (Kafka's ConfigResource.Type)
# Kafka's ConfigSource: a topic's own value, a broker's server.properties, the built-in default.
SOURCE_TOPIC, SOURCE_STATIC_BROKER, SOURCE_DEFAULT = 1, 4, 5
CONFIG_BOOLEAN, CONFIG_INT, CONFIG_LONG, CONFIG_LIST = 1, 3, 5, 7  # Kafka's ConfigType
FIRST_DELETE_BY_ID = 6  # DeleteTopics names topics by name or id from v6
FIRST_CREATE_DETAILS = 5  # CreateTopics answers partitions, replication factor and configs from v5
# New partitions one CreateTopics or CreatePartitions may make, all topics together (Kafka's controller bound,
# answered POLICY_VIOLATION as Kafka does): a request of 1000 topics of 10,000 partitions makes no 10 million.
MAX_PARTITIONS_PER_REQUEST = 10_000


def _zero(v: Any) -> bool:
    return v is None or v == uuid.UUID(int=0)


def _refusal(e: Exception) -> tuple[int, str]:
    if isinstance(e, PidQuorumError):
        return int(e.code), e.message
    if isinstance(e, TopicAdminError):
        return e.code, e.message
    if isinstance(e, OSError):  # the disk refused: Kafka's code for a failed log directory
        log.error("topic administration: %s (answered KAFKA_STORAGE_ERROR)", e)
        return int(Errors.KAFKA_STORAGE_ERROR), f"the broker's disk refused: {e.strerror or e}"
    raise e


def _allowed(server: BrokerContext, req: kafka.Request, resource_type: str, name: str, operation: str) -> bool:
    """May ``req``'s principal do ``operation`` on the resource (always with SASL off)?  Refusals counted, logged."""
    if server.acls is None or server.acls.authorize(req.principal, resource_type, name, operation, req.host):
        return True
    server.counters["authorization_failures"] += 1
    log.info("%s is not allowed %s on %s %r", req.principal, operation, resource_type, str(name)[:200])
    return False


def _denied(req: kafka.Request, operation: str) -> tuple[int, str]:
    return int(Errors.TOPIC_AUTHORIZATION_FAILED), f"{req.principal} is not allowed {operation} on this topic"


async def _on_disk(server: BrokerContext, fn: Any, *args: Any, **kw: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(server._io, functools.partial(fn, *args, **kw))


def _repeated(names: list[Any]) -> set[Any]:
    seen: set[Any] = set()
    return {n for n in names if n in seen or seen.add(n)}


def _within_request_bound(made: int, n: int) -> int:
    """``made`` + ``n`` new partitions in this request, or POLICY_VIOLATION past ``MAX_PARTITIONS_PER_REQUEST``."""
    if 0 < n <= MAX_PARTITIONS_PER_REQUEST - made:
        return made + n
    if n <= 0 or n > MAX_TOPIC_PARTITIONS:
        return made  # a count the storage refuses with its own error (INVALID_PARTITIONS)
    raise TopicAdminError(POLICY_VIOLATION, f"{n} more partitions would make {made + n} new partitions in one "
                                            f"request, at most {MAX_PARTITIONS_PER_REQUEST}")


# ------------------------------------------------------------ CreateTopics
def _only_this_broker(server: BrokerContext, broker_ids: Any) -> None:
    me = server.cfg.broker_id
    if list(broker_ids or ()) != [me]:
        raise TopicAdminError(INVALID_REPLICA_ASSIGNMENT, f"replicas {list(broker_ids or ())[:10]}: this broker "
                                                          f"({me}) holds the only replica of every partition")


def _partition_count(server: BrokerContext, t: Any) -> int:
    """The partition count a CreatableTopic asks for (-1: the broker's default), its replication and
    assignments checked."""
    assignments = t.assignments or ()
    if assignments:
        if int(t.num_partitions) != -1 or int(t.replication_factor) != -1:
            raise TopicAdminError(int(Errors.INVALID_REQUEST), "both num_partitions or replication_factor and "
                                                               "replica assignments were set")
        if sorted(int(a.partition_index) for a in assignments) != list(range(len(assignments))):
            raise TopicAdminError(INVALID_REPLICA_ASSIGNMENT, "the assigned partitions must be 0, 1, ... n-1, "
                                                              "each once")
        for a in assignments:
            _only_this_broker(server, a.broker_ids)
        return len(assignments)
    rf = int(t.replication_factor)
    if rf == 0 or rf < -1:
        raise TopicAdminError(INVALID_REPLICATION_FACTOR, f"replication factor {rf}: it must be larger than 0, "
                                                          f"or -1 for the default")
    if rf > 1:
        raise TopicAdminError(INVALID_REPLICATION_FACTOR, f"replication factor {rf} cannot be reached: this broker "
                                                          f"holds the only replica (at most 1)")
    return int(t.num_partitions)


def topic_configs(storage: Any, info: TopicInfo) -> list[tuple[str, str, int]]:
    """(name, value, source) of every config a topic has, its own values first-class (``SOURCE_TOPIC``)."""
    own = info.config
    return [(n, own[n], SOURCE_TOPIC) if n in own else (n, storage.default_config(n), SOURCE_DEFAULT)
            for n in sorted(TOPIC_CONFIGS)]


async def create_topics(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    validate_only = bool(getattr(b, "validate_only", False))
    topics = list(b.topics or ())
    twice = _repeated([t.name for t in topics])
    cluster_ok: bool | None = None
    results, answered, made = [], set(), 0
    for t in topics:
        name = t.name
        if name in answered:
            continue  # one answer per name, as Kafka
        answered.add(name)
        r: dict[str, Any] = {"name": name or "", "topic_id": None, "error_code": 0, "error_message": None,
                             "num_partitions": -1, "replication_factor": -1, "configs": None}
        results.append(r)
        if name in twice:
            r["error_code"], r["error_message"] = int(Errors.INVALID_REQUEST), \
                f"the request names topic {str(name)[:200]!r} more than once"
            continue
        if cluster_ok is None:
            cluster_ok = server.acls is None or _allowed(server, req, acls.CLUSTER, acls.CLUSTER_NAME, acls.CREATE)
        if not cluster_ok and not _allowed(server, req, acls.TOPIC, str(name), acls.CREATE):
            r["error_code"], r["error_message"] = _denied(req, acls.CREATE)
            continue
        try:
            validate_topic_name(name)
            check_reserved(name)
            if server.storage.topic(name) is not None:
                raise TopicAdminError(TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            n = _partition_count(server, t)
            configs = parse_topic_configs((c.name, c.value) for c in (t.configs or ()))
            made = _within_request_bound(made, n if n != -1 else server.storage.default_partitions)
            info = await _on_disk(server, server.storage.create_topic, name, n, configs, validate_only)
        except Exception as e:  # noqa: BLE001 - _refusal re-raises what is not a refusal
            r["error_code"], r["error_message"] = _refusal(e)
            log.info("CreateTopics v%d %r: error %d: %s", v, str(name)[:200], r["error_code"], r["error_message"])
            continue
        r["topic_id"] = None if validate_only else info.topic_id
        r["num_partitions"], r["replication_factor"] = info.partitions, 1
        r["configs"] = [{k: row[k] for k in ("name", "value", "read_only", "config_source", "is_sensitive")}
                        for row in _topic_rows(server, info, False, False)]  # as DescribeConfigs describes them
    return kio_.response(CREATE_TOPICS, v, {"throttle_time": 0, "topics": results})


def _create_topics_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [{"name": t.name or "", "topic_id": None, "error_code": int(code),
                                       "error_message": code.name, "configs": None} for t in body.topics]
    return kio_.response(CREATE_TOPICS, version, {"throttle_time": 0, "topics": topics})


# ------------------------------------------------------------ DeleteTopics
def _delete_entries(b: Any, version: int) -> list[tuple[str | None, uuid.UUID | None]]:
    if version < FIRST_DELETE_BY_ID:
        return [(n, None) for n in (b.topic_names or ())]
    return [(t.name, None if _zero(t.topic_id) else t.topic_id) for t in (b.topics or ())]


async def delete_topics(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    entries = _delete_entries(b, v)
    twice_names = _repeated([n for n, _ in entries if n is not None])
    twice_ids = _repeated([i for n, i in entries if n is None and i is not None])
    results, answered = [], set()
    for name, tid in entries:
        if (name, tid) in answered:
            continue
        answered.add((name, tid))
        r: dict[str, Any] = {"name": name, "topic_id": tid, "error_code": 0, "error_message": None}
        results.append(r)
        if name is not None and tid is not None:
            r["error_code"], r["error_message"] = int(Errors.INVALID_REQUEST), "give a topic name or an id, not both"
        elif name is None and tid is None:
            r["error_code"], r["error_message"] = int(Errors.INVALID_REQUEST), "neither a topic name nor an id"
        elif name in twice_names or (name is None and tid in twice_ids):
            r["error_code"], r["error_message"] = int(Errors.INVALID_REQUEST), "the topic is named more than once"
        if r["error_code"]:
            r["name"] = name if v >= FIRST_DELETE_BY_ID else (name or "")
            continue
        if name is None:  # by id: its name, for the ACL and the answer
            info = next((t for t in server.storage.topics() if t.topic_id == tid), None)
            r["name"] = name = None if info is None else info.name
        if name is not None and not _allowed(server, req, acls.TOPIC, str(name), acls.DELETE):
            r["error_code"], r["error_message"] = _denied(req, acls.DELETE)
            continue
        try:
            info = await _on_disk(server, server.storage.delete_topic, name, tid)
            r["topic_id"] = info.topic_id
        except Exception as e:  # noqa: BLE001 - _refusal re-raises what is not a refusal
            r["error_code"], r["error_message"] = _refusal(e)
            log.info("DeleteTopics v%d %r: error %d: %s", v, str(name or tid)[:200], r["error_code"],
                     r["error_message"])
        if v < FIRST_DELETE_BY_ID:
            r["name"] = name or ""
    return kio_.response(DELETE_TOPICS, v, {"throttle_time": 0, "responses": results})


def _delete_topics_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    rows = [] if body is None else [{"name": n if version >= FIRST_DELETE_BY_ID else (n or ""), "topic_id": i,
                                     "error_code": int(code), "error_message": code.name}
                                    for n, i in _delete_entries(body, version)]
    return kio_.response(DELETE_TOPICS, version, {"throttle_time": 0, "responses": rows})


# ------------------------------------------------------------ CreatePartitions
async def create_partitions(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    topics = list(b.topics or ())
    twice = _repeated([t.name for t in topics])
    results, answered, made = [], set(), 0
    for t in topics:
        if t.name in answered:
            continue
        answered.add(t.name)
        r = {"name": t.name or "", "error_code": 0, "error_message": None}
        results.append(r)
        if t.name in twice:
            r["error_code"], r["error_message"] = int(Errors.INVALID_REQUEST), "duplicate topic in the request"
            continue
        if not _allowed(server, req, acls.TOPIC, str(t.name), acls.ALTER):
            r["error_code"], r["error_message"] = _denied(req, acls.ALTER)
            continue
        try:
            info = server.storage.topic(t.name) if isinstance(t.name, str) else None
            if t.assignments is not None and info is not None:
                if len(t.assignments) != int(t.count) - info.partitions:
                    raise TopicAdminError(INVALID_REPLICA_ASSIGNMENT, f"{len(t.assignments)} assignments for "
                                                                      f"{int(t.count) - info.partitions} new "
                                                                      f"partitions")
                for a in t.assignments:
                    _only_this_broker(server, a.broker_ids)
            if info is not None and int(t.count) > info.partitions:
                made = _within_request_bound(made, int(t.count) - info.partitions)
            await _on_disk(server, server.storage.create_partitions, t.name, int(t.count), bool(b.validate_only))
        except Exception as e:  # noqa: BLE001 - _refusal re-raises what is not a refusal
            r["error_code"], r["error_message"] = _refusal(e)
            log.info("CreatePartitions v%d %r: error %d: %s", v, str(t.name)[:200], r["error_code"],
                     r["error_message"])
    return kio_.response(CREATE_PARTITIONS, v, {"throttle_time": 0, "results": results})


def _create_partitions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    rows = [] if body is None else [{"name": t.name or "", "error_code": int(code), "error_message": code.name}
                                    for t in body.topics]
    return kio_.response(CREATE_PARTITIONS, version, {"throttle_time": 0, "results": rows})


# ------------------------------------------------------------ DescribeConfigs
# The broker settings that are Kafka's: Kafka's name, BrokerConfig's field (or a function of it), ConfigType, doc.
BROKER_CONFIGS: tuple[tuple[str, Any, int, str], ...] = (
    ("auto.create.topics.enable", "auto_create_topics", CONFIG_BOOLEAN,
     "Create a topic a client produces to or asks Metadata for."),
    ("broker.id", "broker_id", CONFIG_INT, "This broker's id."),
    ("log.cleanup.policy", lambda server: "delete", CONFIG_LIST,
     "Old segments are deleted (compaction is not served)."),
    ("log.retention.bytes", "retention_bytes", CONFIG_LONG, "Old segments are deleted while a partition is larger."),
    ("log.retention.ms", "retention_ms", CONFIG_LONG,
     "A sealed segment is deleted once its newest record is this old."),
    ("log.segment.bytes", "segment_bytes", CONFIG_INT, "Size at which a partition's log rolls to a new segment."),
    ("max.connections", "max_connections", CONFIG_INT, "Client connections at once."),
    ("max.connections.per.ip", "max_connections_per_ip", CONFIG_INT, "Client connections from one address."),
    ("message.max.bytes", lambda server: server.storage.default_config("max.message.bytes"), CONFIG_INT,
     "The largest record batch size allowed."),
    ("num.partitions", "default_partitions", CONFIG_INT, "Partitions of a topic created without a count."),
    ("producer.id.expiration.ms", "producer_id_expiration_ms", CONFIG_INT, "An idle producer's state is dropped."),
    ("socket.request.max.bytes", "max_frame_bytes", CONFIG_INT, "The largest request accepted."),
)


def _text(value: Any) -> str:
    if value is None:
        return "-1"
    return str(value).lower() if isinstance(value, bool) else str(value)


def broker_configs(server: BrokerContext) -> list[tuple[str, str, int, int, str]]:
    """(name, value, source, type, doc) of the broker settings Kafka has: STATIC_BROKER_CONFIG when set
    to something else than the default, else DEFAULT_CONFIG."""
    cfg, out = server.cfg, []
    fields = type(cfg).__dataclass_fields__ if hasattr(type(cfg), "__dataclass_fields__") else {}
    for name, attr, ctype, doc in BROKER_CONFIGS:
        if callable(attr):  # not a setting of this broker: the built-in value
            out.append((name, attr(server), SOURCE_DEFAULT, ctype, doc))
            continue
        value = getattr(cfg, attr)
        f = fields.get(attr)
        default = getattr(f, "default", None) if f is not None else None
        out.append((name, _text(value), SOURCE_DEFAULT if value == default else SOURCE_STATIC_BROKER, ctype, doc))
    return out


def _config_row(name: str, value: str, source: int, ctype: int, doc: str, read_only: bool,
                synonyms: list[dict], include_doc: bool) -> dict:
    return {"name": name, "value": value, "read_only": read_only, "config_source": source,
            "is_default": source == SOURCE_DEFAULT, "is_sensitive": False, "synonyms": synonyms,
            "config_type": ctype, "documentation": doc if include_doc else None}


def _topic_rows(server: BrokerContext, info: TopicInfo, synonyms: bool, docs: bool) -> list[dict]:
    broker = {name: (value, source) for name, value, source, _, _ in broker_configs(server)}
    rows = []
    for name, value, source in topic_configs(server.storage, info):
        d = TOPIC_CONFIGS[name]
        syn = []
        if synonyms:
            if source == SOURCE_TOPIC:
                syn.append({"name": name, "value": value, "source": SOURCE_TOPIC})
            bvalue, bsource = broker.get(d.broker_name, (server.storage.default_config(name), SOURCE_DEFAULT))
            syn.append({"name": d.broker_name, "value": bvalue, "source": bsource})
        if source == SOURCE_DEFAULT:
            source = broker.get(d.broker_name, (value, SOURCE_DEFAULT))[1]
        rows.append(_config_row(name, value, source, d.config_type, d.doc, False, syn, docs))
    return rows


def _describe_one(server: BrokerContext, req: kafka.Request, res: Any) -> dict:
    b = req.body
    rtype, rname = int(res.resource_type), res.resource_name
    r: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": rtype,
                         "resource_name": rname or "", "configs": []}
    synonyms, docs = bool(getattr(b, "include_synonyms", False)), bool(getattr(b, "include_documentation", False))
    if rtype == RESOURCE_TOPIC:
        if not _allowed(server, req, acls.TOPIC, str(rname), acls.DESCRIBE_CONFIGS):
            r["error_code"], r["error_message"] = _denied(req, acls.DESCRIBE_CONFIGS)
            return r
        try:
            validate_topic_name(rname)
        except PidQuorumError as e:
            r["error_code"], r["error_message"] = int(e.code), e.message
            return r
        info = server.storage.topic(rname)
        if info is None:
            r["error_code"], r["error_message"] = int(Errors.UNKNOWN_TOPIC_OR_PARTITION), f"unknown topic {rname!r}"
            return r
        rows = _topic_rows(server, info, synonyms, docs)
    elif rtype == RESOURCE_BROKER:
        if rname not in ("", str(server.cfg.broker_id)):
            r["error_code"] = int(Errors.INVALID_REQUEST)
            r["error_message"] = (f"unexpected broker id {str(rname)[:50]!r}: this broker is {server.cfg.broker_id} "
                                  f"(or \"\" for the defaults)")
            return r
        if not _allowed(server, req, acls.CLUSTER, acls.CLUSTER_NAME, acls.DESCRIBE_CONFIGS):
            r["error_code"] = int(Errors.CLUSTER_AUTHORIZATION_FAILED)
            r["error_message"] = f"{req.principal} is not allowed DESCRIBE_CONFIGS on the cluster"
            return r
        rows = [_config_row(n, val, src, ctype, doc, True,
                            [{"name": n, "value": val, "source": src}] if synonyms else [], docs)
                for n, val, src, ctype, doc in broker_configs(server)]
    else:
        r["error_code"] = int(Errors.INVALID_REQUEST)
        r["error_message"] = f"resource type {rtype} is not served (2: topic, 4: broker)"
        return r
    keys = res.configuration_keys
    wanted = None if keys is None else set(keys)
    r["configs"] = rows if wanted is None else [row for row in rows if row["name"] in wanted]
    return r


async def describe_configs(server: BrokerContext, req: kafka.Request) -> Any:
    results = [_describe_one(server, req, res) for res in (req.body.resources or ())]
    return kio_.response(DESCRIBE_CONFIGS, req.api_version, {"throttle_time": 0, "results": results})


def _describe_configs_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    rows = [] if body is None else [{"error_code": int(code), "error_message": code.name,
                                     "resource_type": int(res.resource_type), "resource_name": res.resource_name or "",
                                     "configs": []} for res in body.resources]
    return kio_.response(DESCRIBE_CONFIGS, version, {"throttle_time": 0, "results": rows})


# ------------------------------------------------------------ AlterConfigs, IncrementalAlterConfigs
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' config_operation


def _incremental(own: dict[str, str], entries: Any) -> dict[str, str]:
    """A topic's own configs after IncrementalAlterConfigs' ``entries`` (checked by ``parse_topic_configs``)."""
    out = dict(own)
    for c in entries:
        op, name = int(c.config_operation), c.name
        if name not in TOPIC_CONFIGS:
            raise TopicAdminError(INVALID_CONFIG, f"unknown topic config {str(name)[:200]!r}")
        if op == OP_SET:
            out[name] = c.value
        elif op == OP_DELETE:
            out.pop(name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if TOPIC_CONFIGS[name].config_type != CONFIG_LIST:
                raise TopicAdminError(INVALID_CONFIG, f"{name} is not a list: APPEND and SUBTRACT do not apply")
            items = [x for x in out.get(name, "delete").split(",") if x]
            for x in (p.strip() for p in str(c.value or "").split(",") if p.strip()):
                if op == OP_APPEND and x not in items:
                    items.append(x)
                elif op == OP_SUBTRACT and x in items:
                    items.remove(x)
            out[name] = ",".join(items)
        else:
            raise TopicAdminError(int(Errors.INVALID_REQUEST), f"unknown config operation {op} (0 SET, 1 DELETE, "
                                                               f"2 APPEND, 3 SUBTRACT)")
    return out


async def _alter(server: BrokerContext, req: kafka.Request, incremental: bool) -> list[dict]:
    """Each resource of an AlterConfigs / IncrementalAlterConfigs: a topic's own configs replaced (AlterConfigs:
    those not given go back to the broker's) or changed, durably; other resource types are refused."""
    b = req.body
    resources = list(b.resources or ())
    twice = _repeated([(int(r.resource_type), r.resource_name) for r in resources])
    out = []
    for res in resources:
        rtype, rname = int(res.resource_type), res.resource_name
        r = {"error_code": 0, "error_message": None, "resource_type": rtype, "resource_name": rname or ""}
        out.append(r)
        entries = list(res.configs or ())
        try:
            if (rtype, rname) in twice:
                raise TopicAdminError(int(Errors.INVALID_REQUEST), "the resource is named more than once")
            if rtype == RESOURCE_BROKER:
                if not _allowed(server, req, acls.CLUSTER, acls.CLUSTER_NAME, acls.ALTER_CONFIGS):
                    raise TopicAdminError(int(Errors.CLUSTER_AUTHORIZATION_FAILED),
                                          f"{req.principal} is not allowed ALTER_CONFIGS on the cluster")
                raise TopicAdminError(int(Errors.INVALID_REQUEST), "broker configs are static on this broker "
                                                                   "(its settings file and flags)")
            if rtype != RESOURCE_TOPIC:
                raise TopicAdminError(int(Errors.INVALID_REQUEST), f"resource type {rtype} is not served (2: topic)")
            if not _allowed(server, req, acls.TOPIC, str(rname), acls.ALTER_CONFIGS):
                raise TopicAdminError(*_denied(req, acls.ALTER_CONFIGS))
            validate_topic_name(rname)
            info = server.storage.topic(rname)
            if info is None:
                raise TopicAdminError(int(Errors.UNKNOWN_TOPIC_OR_PARTITION), f"unknown topic {rname!r}")
            if len({c.name for c in entries}) != len(entries):
                raise TopicAdminError(int(Errors.INVALID_REQUEST), "a config is named more than once")
            wanted = _incremental(info.config, entries) if incremental else {c.name: c.value for c in entries}
            configs = parse_topic_configs(wanted.items())
            await _on_disk(server, server.storage.alter_topic_configs, rname, configs, bool(b.validate_only))
        except Exception as e:  # noqa: BLE001 - _refusal re-raises what is not a refusal
            r["error_code"], r["error_message"] = _refusal(e)
            log.info("%sAlterConfigs %d %r: error %d: %s", "Incremental" * incremental, rtype, str(rname)[:200],
                     r["error_code"], r["error_message"])
    return out


async def alter_configs(server: BrokerContext, req: kafka.Request) -> Any:
    return kio_.response(ALTER_CONFIGS, req.api_version, {"throttle_time": 0,
                                                          "responses": await _alter(server, req, False)})


async def incremental_alter_configs(server: BrokerContext, req: kafka.Request) -> Any:
    return kio_.response(INCREMENTAL_ALTER_CONFIGS, req.api_version, {"throttle_time": 0,
                                                                      "responses": await _alter(server, req, True)})


def _alter_error(api_key: int) -> Any:
    def error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
        rows = [] if body is None else [{"error_code": int(code), "error_message": code.name,
                                         "resource_type": int(r.resource_type), "resource_name": r.resource_name or ""}
                                        for r in body.resources]
        return kio_.response(api_key, version, {"throttle_time": 0, "responses": rows})
    return error


RPCS: dict[int, BrokerRpc] = {
    # ACLs: checked per topic / resource by the handlers (CREATE, DELETE, ALTER, DESCRIBE_CONFIGS).
    CREATE_TOPICS: BrokerRpc("CreateTopics", (2, 7), create_topics, _create_topics_error),
    DELETE_TOPICS: BrokerRpc("DeleteTopics", (1, 6), delete_topics, _delete_topics_error),
    CREATE_PARTITIONS: BrokerRpc("CreatePartitions", (0, 3), create_partitions, _create_partitions_error),
    DESCRIBE_CONFIGS: BrokerRpc("DescribeConfigs", (1, 4), describe_configs, _describe_configs_error),
    ALTER_CONFIGS: BrokerRpc("AlterConfigs", (0, 2), alter_configs, _alter_error(ALTER_CONFIGS)),
    INCREMENTAL_ALTER_CONFIGS: BrokerRpc("IncrementalAlterConfigs", (0, 1), incremental_alter_configs,
                                         _alter_error(INCREMENTAL_ALTER_CONFIGS)),
}
