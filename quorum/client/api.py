"""The quorum client port's API table, and the bodies of its answers.

Framing, parsing and encoding are ``records.wire.kafka``'s; this module declares what
the quorum serves.  Besides the Kafka APIs, two pidquorum APIs carry msgpack
bodies: ``DescribeState`` (``ADMIN_API_KEY``), the node's Raft status and state
summary, used by ``pidctl quorum status`` and ``pidctl blocks latest``; and the
record RPCs (``RECORD_API_KEY``), whose requests and responses are the records of
``RPC_RESPONSES`` (records/schema.py), with which a broker applies
InitProducerId to a transactional id in the quorum, seeds, migrates, and
manages ACLs and quotas.
"""
from __future__ import annotations

import uuid
from typing import Any

from kio.schema.broker_registration.v0.request import Listener
from kio.static.primitive import i16, i32, i64, u16

import records
from records import RecordError
from records.codec import from_obj, to_obj
from records.wire.kafka import API_VERSIONS, ApiTable, MsgpackApi, encode_msgpack_request, request_entity

# The record RPCs: request record -> response record.
RPC_RESPONSES: dict[type, type] = {
    records.InitTransactionalProducerRequest: records.InitTransactionalProducerResponse,
    records.DescribeTransactionalIdRequest: records.DescribeTransactionalIdResponse,
    records.SeedProducerIdsRequest: records.SeedProducerIdsResponse,
    records.MigrationCommandRequest: records.MigrationCommandResponse,
    records.AlterAclsRequest: records.AlterAclsResponse,
    records.DescribeAclsRequest: records.DescribeAclsResponse,
    records.AlterClientQuotaRequest: records.AlterClientQuotaResponse,
    records.TransactionRequest: records.TransactionResponse,
    records.BlockHistoryRequest: records.BlockHistoryResponse,
}

BROKER_REGISTRATION = 62
BROKER_HEARTBEAT = 63
ALLOCATE_PRODUCER_IDS = 67
DESCRIBE_CLIENT_QUOTAS = 48  # Kafka's own API: brokers poll the quota configuration with it
ENVELOPE = 58  # Kafka's (KIP-590): a follower forwards a client's request to the leader in one; not advertised
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
             DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas", ENVELOPE: "Envelope",
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


# The client's view (encoding requests, reading answers); the server's, with its error answers, is
# quorum.rpcs.SERVER_API.
QUORUM_API = ApiTable(
    versions=SUPPORTED, names=API_NAMES, error_body=None,
    msgpack={
        ADMIN_API_KEY: MsgpackApi("DescribeState", decode_request=_state_request, decode_response=lambda obj: obj,
                                  encode=lambda body: body),
        RECORD_API_KEY: MsgpackApi(
            "pidquorum RPC",
            decode_request=lambda obj: decode_payload(obj, tuple(RPC_RESPONSES)),
            decode_response=lambda obj: decode_payload(obj, tuple(RPC_RESPONSES.values())),
            encode=lambda body: body if isinstance(body, dict) else to_obj(body)),
    })


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


def allocate_request(broker_id: int, broker_epoch: int) -> Any:
    return request_entity(ALLOCATE_PRODUCER_IDS, 0, broker_id=i32(broker_id), broker_epoch=i64(broker_epoch))


def registration_request(broker_id: int, incarnation_id: uuid.UUID, listener: str = "") -> Any:
    return request_entity(BROKER_REGISTRATION, 0, broker_id=i32(broker_id), cluster_id="pidquorum",
                          incarnation_id=incarnation_id, listeners=listeners(listener), features=(), rack=None)


def heartbeat_request(broker_id: int, broker_epoch: int, want_fence: bool = False,
                      want_shut_down: bool = False) -> Any:
    return request_entity(BROKER_HEARTBEAT, 0, broker_id=i32(broker_id), broker_epoch=i64(broker_epoch),
                          current_metadata_offset=i64(0), want_fence=want_fence, want_shut_down=want_shut_down)


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
