"""Every RPC of the quorum's client port, declared once: its API key (or request record), the ACL
operations that allow it, its handler and its answers.  Dispatch, authorization, error answers and
forwarding (``quorum.server``) read only this table.

A handler is one of: ``generate(state, request, ctx) -> Result``, run on the leader by the proposer
against a scratch fork of the applied state, its records proposed and its value answered once applied
(a follower forwards the frame); ``submit(proposer, request, timeout, on_value)``, the path of an RPC a
controller owns (AllocateProducerIds and MigrationCommand: ``quorum.producer_ids``); or
``serve(node, request)``, answered from what a node applied (``leader_read``: by the leader only).
``respond`` turns the value into the response body, ``error`` builds an error answer.
"""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from kio.schema.envelope.v0.request import EnvelopeRequest
from kio.schema.errors import ErrorCode
from kio.static.primitive import f64, i32, i64

from quorum.client import api as quorum_api
from records import (
    AlterAclsRequest,
    AlterAclsResponse,
    AlterClientQuotaRequest,
    AlterClientQuotaResponse,
    BlockHistoryRequest,
    BlockHistoryResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    InitTransactionalProducerRequest,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
    TransactionRequest,
    TransactionResponse,
)
from quorum.security import acl as acl_rules
from quorum.security.acl import Acl
from snapshots.storage.disk import CorruptFileError
from records.wire import kafka
from records.wire.errors import Errors, InvalidRequestError, for_code

from . import membership
from .client_quotas import ClientQuotaManager, parse_user
from .config import NodeConfig
from .managers import LIST, PENDING, Context, QuorumState, Result, txn_json
from .producer_ids import check_issuing, generate_allocate, generate_migrate, generate_seed
from .service import Service
from .trail import BlockPage, read_block_page


class Node(Protocol):
    """What a ``serve`` handler may use of the node that serves it (``quorum.server.QuorumServer``)."""
    service: Service
    cfg: NodeConfig
    api_table: Any

    def status(self) -> dict[str, Any]: ...

    async def answer_forwarded(self, envelope: Any) -> bytes: ...


Generate = Callable[[QuorumState, Any, Context], Result]
Serve = Callable[[Node, kafka.Request], Awaitable[Any]]
Submit = Callable[[Any, Any, float, Callable[[Any], None] | None], Awaitable[Any]]  # proposer, request, ...


@dataclass(frozen=True)
class Rpc:
    api_key: int
    respond: Callable[[int, Any], Any]
    error: Callable[[int, Errors, str, int], Any]
    acl: Callable[[Any], tuple[str, ...]]  # request body -> operations on the cluster, any one allows it
    record: type | None = None  # the request record of a record RPC (RECORD_API_KEY)
    generate: Generate | None = None
    serve: Serve | None = None
    submit: Submit | None = None
    # Whether this request needs the leader (a generate handler's default: always).
    on_leader: Callable[[Any], bool] | None = None
    # A read served from the leader's applied state (a follower forwards it): it sees every write whose
    # answer came before it.  A follower learns a new commit index with the next AppendEntries, a few
    # milliseconds after the leader answered the write.  A callable: which requests of the RPC are (the
    # others are proposed, or served where they arrive: ``on_leader``).
    leader_read: bool | Callable[[Any], bool] = False

    @property
    def name(self) -> str:
        return self.record.SPEC.name if self.record is not None else quorum_api.API_NAMES.get(self.api_key,
                                                                                     f"API {self.api_key}")

    def needs_leader(self, body: Any) -> bool:
        if self.generate is None:
            return self.reads_on_leader(body)
        return self.on_leader(body) if self.on_leader is not None else True

    def reads_on_leader(self, body: Any) -> bool:
        """Whether the leader answers ``body`` with ``serve``, from its applied state (nothing proposed)."""
        return self.leader_read(body) if callable(self.leader_read) else self.leader_read


# ---------------------------------------------------------------- answers
def _kafka_error(api_key: int, **fields: Any) -> Callable[[int, Errors, str, int], Any]:
    """The error answer of a Kafka API: ``fields`` besides throttle time and error code."""
    def body(version: int, code: Errors, message: str, throttle_ms: int) -> Any:
        cls = kafka.load_response_schema(api_key, version)
        extra = {k: (v(code) if callable(v) else v) for k, v in fields.items()}
        return cls(throttle_time=kafka.ms(throttle_ms), error_code=ErrorCode(int(code)), **extra)
    return body


def _kafka_response(api_key: int, build: Callable[[Any], dict]) -> Callable[[int, Any], Any]:
    def body(version: int, value: Any) -> Any:
        cls = kafka.load_response_schema(api_key, version)
        return cls(throttle_time=kafka.ms(0), error_code=ErrorCode.none, **build(value))
    return body


def _record_error(response: type) -> Callable[[int, Errors, str, int], Any]:
    return lambda version, code, message, throttle_ms: response(error_code=int(code), error_message=message)


def _quota_entries(entries: list[dict], version: int) -> dict:
    """DescribeClientQuotas: one entry per user (entity_name None: the default), its quota values."""
    module = __import__(kafka.load_response_schema(quorum_api.DESCRIBE_CLIENT_QUOTAS, version).__module__,
                        fromlist=["EntryData"])
    return {"error_message": None, "entries": tuple(
        module.EntryData(entity=(module.EntityData(entity_type="user", entity_name=e["user"]),),
                         values=tuple(module.ValueData(key=k, value=f64(v)) for k, v in e["values"].items()))
        for e in entries)}


def _describe_state_error(version: int, code: Errors, message: str, throttle_ms: int) -> dict:
    return {"error_code": int(code), "error_message": message}


# --------------------------------------------------------------- handlers
def _register(state: QuorumState, b: Any, ctx: Context) -> Result:
    if b.incarnation_id is None:
        raise InvalidRequestError("incarnation id is required")
    return state.registrations.generate_register(int(b.broker_id), str(b.incarnation_id), quorum_api.listener_address(b),
                                                 ctx.now_ms, ctx.session_timeout_ms)


def _heartbeat(state: QuorumState, b: Any, ctx: Context) -> Result:
    return state.registrations.generate_heartbeat(int(b.broker_id), int(b.broker_epoch), bool(b.want_fence),
                                                  bool(b.want_shut_down), ctx.now_ms)


def _init_txn(state: QuorumState, b: InitTransactionalProducerRequest, ctx: Context) -> Result:
    check_issuing(state)
    res = state.transactions.generate_init(
        b.broker_id, b.broker_epoch, b.transactional_id, b.transaction_timeout_ms, b.producer_id, b.producer_epoch,
        registrations=state.registrations, producer_ids=state.producer_ids, now_ms=ctx.now_ms, settings=ctx.txn,
        request_id=b.request_id)
    if res.response[2] is not None:
        return res
    # Answered: no transaction is open, and the producer's next one is the last one's sequence plus 1.
    return Result(res.records, (*res.response, state.transactions.last_sequence(b.transactional_id, res.records)))


def _txn(state: QuorumState, b: TransactionRequest, ctx: Context) -> Result:
    try:
        partitions = json.loads(b.partitions)
    except ValueError:
        raise InvalidRequestError("partitions is not JSON") from None
    res = state.transactions.generate_txn(
        b.op, b.broker_id, b.broker_epoch, b.transactional_id, b.producer_id, b.producer_epoch, partitions,
        b.start_time_ms, registrations=state.registrations, now_ms=ctx.now_ms, sequence=b.sequence)
    return Result(res.records, txn_json(res.response, state.transactions.get(b.transactional_id)))


async def _read_txns(server: Node, req: kafka.Request) -> list[dict]:
    """``pending``, from this node's applied state (a follower's may lag: every step on them is decided
    again by the leader), the transactions some coordinator must drive; ``list``, from the leader's
    (``Rpc.leader_read``: it sees every step answered before it, as ``describe`` does), a page of every
    live transactional id (``TransactionalIdManager.list_page``)."""
    b = req.body
    if b.op not in (PENDING, LIST):
        raise InvalidRequestError(f"operation {b.op!r} must go to the leader")
    limit = max(1, min(int(b.limit), 10_000))
    service = server.service
    with service.lock:
        if b.op == LIST:
            return service.state.transactions.list_page(b.transactional_id, limit)
        return service.state.transactions.pending(int(service.clock.time() * 1000), limit)


def _init_response(r: tuple) -> InitTransactionalProducerResponse:
    if r[2] is not None:
        # Committed (an abort to fence, or nothing), but not an answer yet: the coordinator completes the
        # transaction (``TransactionRequest`` describe, its markers, complete) and asks again.
        return InitTransactionalProducerResponse(
            error_code=int(Errors.CONCURRENT_TRANSACTIONS), producer_id=r[0], producer_epoch=r[1],
            error_message=f"the transaction of producer {r[0]} is {r[2].state}: it is completed first")
    return InitTransactionalProducerResponse(error_code=0, producer_id=r[0], producer_epoch=r[1], txn_sequence=r[3])


def _read_txn(state: QuorumState, b: DescribeTransactionalIdRequest, ctx: Context) -> Result:
    # A linearizable read: proposed as a record-less entry, answered once it is applied.
    return Result([], state.transactions.get(b.transactional_id))


def _alter_acl(state: QuorumState, b: AlterAclsRequest, ctx: Context) -> Result:
    acl = Acl(principal=b.principal, resource_type=b.resource_type, resource_name=b.resource_name,
              pattern_type=b.pattern_type, operation=b.operation, permission=b.permission, host=b.host)
    return state.acls.generate_alter(b.action, acl, ctx.now_ms)


def _alter_quota(state: QuorumState, b: AlterClientQuotaRequest, ctx: Context) -> Result:
    records, changed = state.quotas.generate_alter(b.user, b.key, b.value, b.remove, ctx.now_ms)
    return Result(records, changed)


async def _validate_quota(server: Node, req: kafka.Request) -> bool:
    """A validate-only AlterClientQuota: checked against this node's applied quotas, nothing proposed."""
    b = req.body
    with server.service.lock:
        scratch = ClientQuotaManager()
        scratch.quotas = {u: dict(v) for u, v in server.service.state.quotas.quotas.items()}
    return scratch.generate_alter(b.user, b.key, b.value, b.remove, 0)[1]


async def _api_versions(server: Node, req: kafka.Request) -> Any:
    return kafka.api_versions_body(req.api_version, Errors.NONE, server.api_table)


async def _describe_state(server: Node, req: kafka.Request) -> dict:
    action = req.body.get("action")
    if action in membership.ACTIONS:
        return await membership.handle(server.service, action, req.body)
    if action == "snapshot":
        server.service.raft.force_snapshot()
    elif action is not None:
        raise InvalidRequestError(f"unknown DescribeState action {action!r}")
    return server.status()


async def _describe_acls(server: Node, req: kafka.Request) -> tuple[list, int]:
    # The leader's applied entries (a follower forwards the request: Rpc.leader_read).
    b = req.body
    with server.service.lock:
        acls = server.service.state.acls.acls()
        applied = server.service.applied_index
    return [x.to_dict() for x in acls if not b.principal or x.principal == b.principal], applied


async def _describe_client_quotas(server: Node, req: kafka.Request) -> list[dict]:
    """DescribeClientQuotas from the leader's applied state (no log entry: brokers poll it; a follower
    forwards it, ``Rpc.leader_read``), so a read sees every change answered before it.

    Only a leader serves it (``QuorumServer._run``), so a node cut off from the quorum stops answering
    within the leader step-down timeout instead of serving old quotas.
    Filters: user entity, exact name / default / any (Kafka's match types 0, 1, 2).
    """
    wanted: list[tuple[int, str | None]] = []
    for c in req.body.components:
        if c.entity_type != "user":
            raise InvalidRequestError(f"quotas are per user; entity type {c.entity_type!r} is not supported")
        match_type = int(c.match_type)
        if match_type not in (0, 1, 2):
            raise InvalidRequestError(f"unknown match type {match_type}")
        wanted.append((match_type, parse_user(c.match) if match_type == 0 else None))
    with server.service.lock:
        entries = server.service.state.quotas.entries()

    def keep(user: str | None) -> bool:
        for match_type, name in wanted:
            if match_type == 0 and user != name or match_type == 1 and user is not None:
                return False
            if match_type == 2 and user is None:
                return False  # "any" names a specific user, not the default (as in Kafka)
        return True
    return [e for e in entries if keep(e["user"])]


async def _block_history(server: Node, req: kafka.Request) -> tuple[int, int, int, BlockPage]:
    """A page of this node's audit trail (``quorum.trail.read_block_page``, in an I/O thread: it reads the
    file), with the node's id and applied index: (node id, applied index, trail index, page)."""
    b = req.body
    if not -1 <= int(b.broker_id):
        raise InvalidRequestError(f"broker id {b.broker_id} is not -1 (every broker) or a broker id")
    limit = max(1, min(int(b.limit), MAX_BLOCK_PAGE))
    service = server.service
    last_index, end = service.audit.extent()  # first: the applied index read after it is at least as far
    with service.lock:
        applied = service.applied_index
    read = functools.partial(read_block_page, service.audit.path, end, last_index,
                             (int(b.after_raft_index), int(b.after_position)), int(b.cursor_offset), limit,
                             None if b.broker_id == -1 else int(b.broker_id))
    try:
        page = await asyncio.get_running_loop().run_in_executor(None, read)
    except (CorruptFileError, OSError) as e:
        raise for_code(Errors.KAFKA_STORAGE_ERROR, f"node {service.cfg.node_id}'s audit trail: {e}") from None
    return service.cfg.node_id, applied, last_index, page


def _block_history_response(version: int, r: tuple[int, int, int, BlockPage]) -> BlockHistoryResponse:
    node_id, applied, last_index, page = r
    return BlockHistoryResponse(error_code=0, node_id=node_id, applied_index=applied, trail_index=last_index,
                                blocks=json.dumps(page.blocks), gaps=json.dumps(page.gaps),
                                next_raft_index=page.cursor[0], next_position=page.cursor[1],
                                next_offset=page.cursor[2], more=page.more)


async def _envelope(server: Node, req: kafka.Request) -> bytes:
    """A request a follower forwarded (Kafka's Envelope, KIP-590): the client's frame as it arrived, its
    principal and address.  Answered with the raw answer frame the follower relays; a node that is not
    the leader (any more) says so in the envelope, and the follower retries the new leader."""
    return await server.answer_forwarded(req.body)


def forward_envelope(req: kafka.Request, peer: Any) -> EnvelopeRequest:
    """The Envelope a follower sends the leader for ``req``: its raw frame, principal and client address."""
    try:
        address = ipaddress.ip_address(acl_rules.peer_host(peer) or "").packed
    except ValueError:
        address = b""
    return EnvelopeRequest(request_data=req.raw, request_principal=req.principal.encode(),
                           client_host_address=address)


def envelope_peer(address: bytes) -> tuple[str, int] | None:
    """The (host, port) an Envelope's client address stands for (ACL host matching)."""
    if len(address) not in (4, 16):
        return None
    return str(ipaddress.ip_address(address)), 0


# ------------------------------------------------------------------ table
_BROKERS = (acl_rules.CLUSTER_ACTION,)  # what brokers do
_ADMIN = (acl_rules.ALTER,)
_READ = (acl_rules.DESCRIBE, acl_rules.CLUSTER_ACTION)  # administrators and brokers (which poll) alike
MAX_BLOCK_PAGE = 10_000  # blocks in one BlockHistoryResponse at most (about 150 bytes of JSON each)


def _rpcs() -> list[Rpc]:
    return [
        Rpc(quorum_api.API_VERSIONS, acl=lambda b: (), serve=_api_versions, respond=lambda v, body: body,
            error=lambda v, code, m, t: kafka.api_versions_body(v, code, quorum_api.SUPPORTED)),
        Rpc(quorum_api.ALLOCATE_PRODUCER_IDS, acl=lambda b: _BROKERS, generate=generate_allocate,
            submit=lambda proposer, body, timeout, on_value: proposer.producer_ids.allocate(body, timeout, on_value),
            respond=_kafka_response(quorum_api.ALLOCATE_PRODUCER_IDS,
                                    lambda block: {"producer_id_start": i64(block[0]), "producer_id_len": i32(block[1])}),
            error=_kafka_error(quorum_api.ALLOCATE_PRODUCER_IDS, producer_id_start=i64(-1), producer_id_len=i32(0))),
        Rpc(quorum_api.BROKER_REGISTRATION, acl=lambda b: _BROKERS, generate=_register,
            respond=_kafka_response(quorum_api.BROKER_REGISTRATION, lambda epoch: {"broker_epoch": i64(epoch)}),
            error=_kafka_error(quorum_api.BROKER_REGISTRATION, broker_epoch=i64(-1))),
        Rpc(quorum_api.BROKER_HEARTBEAT, acl=lambda b: _BROKERS, generate=_heartbeat,
            respond=_kafka_response(quorum_api.BROKER_HEARTBEAT, lambda r: {
                "is_caught_up": True, "is_fenced": r["is_fenced"], "should_shut_down": r["should_shut_down"]}),
            error=_kafka_error(quorum_api.BROKER_HEARTBEAT, is_caught_up=False, is_fenced=True, should_shut_down=False)),
        Rpc(quorum_api.DESCRIBE_CLIENT_QUOTAS, acl=lambda b: _READ, serve=_describe_client_quotas, leader_read=True,
            respond=lambda v, entries: kafka.load_response_schema(quorum_api.DESCRIBE_CLIENT_QUOTAS, v)(
                throttle_time=kafka.ms(0), error_code=ErrorCode.none, **_quota_entries(entries, v)),
            error=_kafka_error(quorum_api.DESCRIBE_CLIENT_QUOTAS, error_message=lambda code: code.name, entries=None)),
        Rpc(quorum_api.ADMIN_API_KEY, acl=lambda b: _ADMIN if b.get("action") is not None else _READ,
            serve=_describe_state, respond=lambda v, state: {"error_code": 0, **state},
            error=_describe_state_error),
        Rpc(quorum_api.ENVELOPE, acl=lambda b: (), serve=_envelope,  # nodes only (super users)
            respond=lambda v, data: kafka.load_response_schema(quorum_api.ENVELOPE, 0)(
                response_data=data, error_code=ErrorCode.none),
            error=lambda v, code, m, t: kafka.load_response_schema(quorum_api.ENVELOPE, 0)(
                response_data=None, error_code=ErrorCode(int(code)))),
        # The record RPCs (RECORD_API_KEY): request and response are records (records/schema.py).
        Rpc(quorum_api.RECORD_API_KEY, record=InitTransactionalProducerRequest, acl=lambda b: _BROKERS, generate=_init_txn,
            respond=lambda v, r: _init_response(r),
            error=_record_error(InitTransactionalProducerResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=DescribeTransactionalIdRequest, acl=lambda b: _BROKERS, generate=_read_txn,
            respond=lambda v, cur: DescribeTransactionalIdResponse(error_code=0) if cur is None else
            DescribeTransactionalIdResponse(error_code=0, producer_id=cur.producer_id,
                                            producer_epoch=cur.producer_epoch, state=cur.state),
            error=_record_error(DescribeTransactionalIdResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=TransactionRequest, acl=lambda b: _BROKERS, generate=_txn,
            on_leader=lambda b: b.op != PENDING, leader_read=lambda b: b.op == LIST, serve=_read_txns,
            respond=lambda v, r: TransactionResponse(error_code=0, transactions=json.dumps(r)) if isinstance(r, list)
            else TransactionResponse(error_code=0, transaction=json.dumps(r)),
            error=_record_error(TransactionResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=SeedProducerIdsRequest, acl=lambda b: _ADMIN, generate=generate_seed,
            respond=lambda v, r: SeedProducerIdsResponse(error_code=0, changed=r[0], next_producer_id=r[1]),
            error=_record_error(SeedProducerIdsResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=MigrationCommandRequest, acl=lambda b: _ADMIN, generate=generate_migrate,
            submit=lambda proposer, body, timeout, on_value: proposer.producer_ids.migrate(body, timeout),
            respond=lambda v, r: MigrationCommandResponse(error_code=0, **r),
            error=_record_error(MigrationCommandResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=AlterAclsRequest, acl=lambda b: _ADMIN, generate=_alter_acl,
            respond=lambda v, changed: AlterAclsResponse(error_code=0, changed=changed),
            error=_record_error(AlterAclsResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=DescribeAclsRequest, acl=lambda b: _READ, serve=_describe_acls, leader_read=True,
            respond=lambda v, r: DescribeAclsResponse(error_code=0, acls=json.dumps(r[0]), applied_index=r[1]),
            error=_record_error(DescribeAclsResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=BlockHistoryRequest, acl=lambda b: _READ, serve=_block_history,
            respond=_block_history_response, error=_record_error(BlockHistoryResponse)),
        Rpc(quorum_api.RECORD_API_KEY, record=AlterClientQuotaRequest, acl=lambda b: _ADMIN, generate=_alter_quota,
            on_leader=lambda b: not b.validate_only, serve=_validate_quota,
            respond=lambda v, changed: AlterClientQuotaResponse(error_code=0, changed=changed),
            error=_record_error(AlterClientQuotaResponse)),
    ]


class RpcTable:
    def __init__(self, rpcs: list[Rpc]):
        self.by_key = {r.api_key: r for r in rpcs if r.record is None}
        self.by_record = {r.record: r for r in rpcs if r.record is not None}

    def of(self, api_key: int, body: Any) -> Rpc:
        """The RPC a parsed request asks for (its record's, on the record RPC key)."""
        rpc = self.by_record.get(type(body)) if api_key == quorum_api.RECORD_API_KEY else self.by_key.get(api_key)
        if rpc is None:  # pragma: no cover - the server's ApiTable parses nothing else
            raise InvalidRequestError(f"API {api_key} has no handler")
        return rpc

    def of_request(self, body: Any) -> Rpc:
        """The RPC of a request as a client builds it (a Kafka request entity or a request record)."""
        return self.of(getattr(body, "__api_key__", quorum_api.RECORD_API_KEY), body)

    def error_body(self, api_key: int, version: int, code: Errors, message: str = "", throttle_ms: int = 0,
                   body: Any = None) -> Any:
        """The body of an error answer to any request of the table; on the record RPC key, in the
        request record's response (a request that could not be read: InitTransactionalProducer's)."""
        if api_key == quorum_api.RECORD_API_KEY:
            rpc = self.by_record.get(type(body), self.by_record[InitTransactionalProducerRequest])
        else:
            rpc = self.by_key[api_key]
        return rpc.error(version, code, message or code.name, throttle_ms)


RPCS = RpcTable(_rpcs())

# What the port parses: the advertised APIs, the msgpack ones, and Envelope (from other nodes only; not
# advertised in ApiVersions, as it is nothing a client sends).
SERVER_API = kafka.ApiTable(
    versions={**quorum_api.SUPPORTED, quorum_api.ENVELOPE: (0, 0)}, names=quorum_api.API_NAMES, internal=frozenset({quorum_api.ENVELOPE}),
    error_body=lambda key, version, code, message, throttle_ms: RPCS.error_body(key, version, code, message,
                                                                                throttle_ms),
    msgpack={key: api.with_error_body(lambda code, message, _k=key: RPCS.error_body(_k, 0, code, message))
             for key, api in quorum_api.QUORUM_API.msgpack.items()})


__all__ = ["Context", "Node", "RPCS", "Rpc", "RpcTable", "SERVER_API", "envelope_peer", "forward_envelope"]
