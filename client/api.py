"""The quorum client port's API table, and the bodies of its answers.

Framing, parsing and encoding are ``wire.kafka``'s; this module declares what
the quorum serves.  Besides the Kafka APIs, two pidquorum APIs carry msgpack
bodies: ``DescribeState`` (``ADMIN_API_KEY``), the node's Raft status and state
summary, used by ``pidctl quorum status`` and ``pidctl blocks latest``; and the
record RPCs (``RECORD_API_KEY``), whose requests and responses are the records of
``RPC_RESPONSES`` (records/schema.py), with which a broker applies
InitProducerId to a transactional id in the quorum, seeds, migrates, and
manages ACLs and quotas.
"""
from __future__ import annotations

from typing import Any

from kio.schema.broker_registration.v0.request import Listener
from kio.schema.errors import ErrorCode
from kio.static.primitive import f64, i16, i32, i64, u16

from records import (
    AlterAclsRequest,
    AlterAclsResponse,
    AlterClientQuotaRequest,
    AlterClientQuotaResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    InitTransactionalProducerRequest,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    RecordError,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
)
from records.codec import from_obj, to_obj
from wire.errors import Errors
from wire.kafka import (
    API_VERSIONS,
    ApiTable,
    MsgpackApi,
    encode_msgpack_request,
    load_response_schema,
    ms,
)

# The record RPCs: request record -> response record.
RPC_RESPONSES: dict[type, type] = {
    InitTransactionalProducerRequest: InitTransactionalProducerResponse,
    DescribeTransactionalIdRequest: DescribeTransactionalIdResponse,
    SeedProducerIdsRequest: SeedProducerIdsResponse,
    MigrationCommandRequest: MigrationCommandResponse,
    AlterAclsRequest: AlterAclsResponse,
    DescribeAclsRequest: DescribeAclsResponse,
    AlterClientQuotaRequest: AlterClientQuotaResponse,
}

BROKER_REGISTRATION = 62
BROKER_HEARTBEAT = 63
ALLOCATE_PRODUCER_IDS = 67
DESCRIBE_CLIENT_QUOTAS = 48  # Kafka's own API: brokers poll the quota configuration with it
ADMIN_API_KEY = 10001  # pidquorum DescribeState (msgpack body); outside Kafka's key space
RECORD_API_KEY = 10002  # pidquorum RPCs whose request and response are records (records/schema.py), msgpack
TXN_API_KEY = RECORD_API_KEY  # the transactional-id RPCs travel on it

SUPPORTED: dict[int, tuple[int, int]] = {
    API_VERSIONS: (0, 3),
    BROKER_REGISTRATION: (0, 4),
    BROKER_HEARTBEAT: (0, 1),
    ALLOCATE_PRODUCER_IDS: (0, 0),
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
}
API_NAMES = {API_VERSIONS: "ApiVersions", BROKER_REGISTRATION: "BrokerRegistration",
             BROKER_HEARTBEAT: "BrokerHeartbeat", ALLOCATE_PRODUCER_IDS: "AllocateProducerIds",
             DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas",
             ADMIN_API_KEY: "DescribeState", RECORD_API_KEY: "pidquorum RPC"}


def decode_payload(obj: Any, cls: type | tuple[type, ...]) -> Any:
    """A msgpack-decoded ``[type, version, fields]`` payload of one of the expected record classes."""
    rec = from_obj(obj)
    if not isinstance(rec, cls):
        names = " or ".join(c.SPEC.name for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise RecordError(f"expected {names}, got {type(rec).SPEC.name}")
    return rec


def _state_request(obj: Any) -> dict:
    if not isinstance(obj, dict):
        raise ValueError("body must be a map")
    return obj


def error_body(api_key: int, api_version: int, code: Errors, message: str = "", throttle_ms: int = 0) -> Any:
    """The response body of a Kafka API of the quorum that carries only an error."""
    resp_cls = load_response_schema(api_key, api_version)
    err = ErrorCode(int(code))
    if api_key == ALLOCATE_PRODUCER_IDS:
        return resp_cls(throttle_time=ms(throttle_ms), error_code=err, producer_id_start=i64(-1),
                        producer_id_len=i32(0))
    if api_key == BROKER_REGISTRATION:
        return resp_cls(throttle_time=ms(throttle_ms), error_code=err, broker_epoch=i64(-1))
    if api_key == BROKER_HEARTBEAT:
        return resp_cls(throttle_time=ms(throttle_ms), error_code=err, is_caught_up=False, is_fenced=True,
                        should_shut_down=False)
    if api_key == DESCRIBE_CLIENT_QUOTAS:
        return resp_cls(throttle_time=ms(throttle_ms), error_code=err, error_message=code.name, entries=None)
    raise ValueError(f"no error body for API {api_key}")  # pragma: no cover


QUORUM_API = ApiTable(
    versions=SUPPORTED, names=API_NAMES, error_body=error_body,
    msgpack={
        ADMIN_API_KEY: MsgpackApi("DescribeState", decode_request=_state_request, decode_response=lambda obj: obj,
                                  encode=lambda body: body, error_body=lambda code, msg: {"error_code": int(code)}),
        RECORD_API_KEY: MsgpackApi(
            "pidquorum RPC",
            decode_request=lambda obj: decode_payload(obj, tuple(RPC_RESPONSES)),
            decode_response=lambda obj: decode_payload(obj, tuple(RPC_RESPONSES.values())),
            encode=lambda body: body if isinstance(body, dict) else to_obj(body),
            error_body=lambda code, msg: InitTransactionalProducerResponse(error_code=int(code), error_message=msg)),
    })


# ----------------------------------------------------------------- responses


def allocate_response(start: int, length: int, throttle_ms: int = 0) -> Any:
    resp_cls = load_response_schema(ALLOCATE_PRODUCER_IDS, 0)
    return resp_cls(throttle_time=ms(throttle_ms), error_code=ErrorCode.none, producer_id_start=i64(start),
                    producer_id_len=i32(length))


def client_quotas_response(version: int, entries: list[dict]) -> Any:
    """DescribeClientQuotas: one entry per user (entity_name None: the default), its quota values."""
    resp_cls = load_response_schema(DESCRIBE_CLIENT_QUOTAS, version)
    module = __import__(resp_cls.__module__, fromlist=["EntryData"])
    return resp_cls(throttle_time=ms(0), error_code=ErrorCode.none, error_message=None, entries=tuple(
        module.EntryData(entity=(module.EntityData(entity_type="user", entity_name=e["user"]),),
                         values=tuple(module.ValueData(key=k, value=f64(v)) for k, v in e["values"].items()))
        for e in entries))


def registration_response(version: int, epoch: int) -> Any:
    resp_cls = load_response_schema(BROKER_REGISTRATION, version)
    return resp_cls(throttle_time=ms(0), error_code=ErrorCode.none, broker_epoch=i64(epoch))


def heartbeat_response(version: int, is_fenced: bool, should_shut_down: bool) -> Any:
    resp_cls = load_response_schema(BROKER_HEARTBEAT, version)
    return resp_cls(throttle_time=ms(0), error_code=ErrorCode.none, is_caught_up=True, is_fenced=is_fenced,
                    should_shut_down=should_shut_down)


# ------------------------------------------------------------------ requests


def msgpack_api_of(body: Any) -> int:
    """The msgpack API a request body belongs to: a dict is DescribeState, a record its own API."""
    if isinstance(body, dict):
        return ADMIN_API_KEY
    if type(body) in RPC_RESPONSES:
        return RECORD_API_KEY
    raise TypeError(f"not a pidquorum msgpack request: {type(body).__name__}")


def encode_admin_request(body: Any, correlation_id: int, client_id: str = "pidquorum") -> bytes:
    """A msgpack API request frame: DescribeState (a dict) or a record RPC (its request record)."""
    return encode_msgpack_request(msgpack_api_of(body), body if isinstance(body, dict) else to_obj(body),
                                  correlation_id, client_id)


def listeners(address: str) -> tuple:
    """BrokerRegistration listeners for one "host:port" ("" gives none)."""
    if not address:
        return ()
    host, _, port = address.rpartition(":")
    return (Listener(name="PLAINTEXT", host=host, port=u16(int(port)), security_protocol=i16(0)),)


def listener_address(body: Any) -> str:
    for lst in getattr(body, "listeners", ()):
        return f"{lst.host}:{lst.port}"
    return ""
