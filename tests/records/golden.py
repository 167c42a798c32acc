"""The records' golden instances and bytes (test_records*): one fixed instance per record and payload type
and the exact bytes it must encode to, plus the integer limits the tests probe."""
from __future__ import annotations

from records import (
    AclRecord,
    AllocateProducerIdsRecord,
    AlterAclsRequest,
    AlterAclsResponse,
    AlterClientQuotaRequest,
    AlterClientQuotaResponse,
    AuditEntry,
    AuditGap,
    BlockHistoryRequest,
    BlockHistoryResponse,
    BridgeReservationRecord,
    BrokerEpochCursorRecord,
    ClientQuotaRecord,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    FenceBrokerRecord,
    InitTransactionalProducerRequest,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    MigrationCursorRecord,
    MigrationStateRecord,
    ProducerIdCursorRecord,
    ProducerIdHistoryRecord,
    ProducerIdSeedRecord,
    RegisterBrokerRecord,
    RemoveAclRecord,
    RemoveTransactionalIdRecord,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
    TransactionalIdRecord,
    TransactionRequest,
    TransactionResponse,
    TransactionStateRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

TS = 1700000000000
INCARNATION = "6f1c0a52-8a1e-4d0b-9a55-2b9f3e1d7c10"

# One fixed instance per record type, and the exact bytes it must encode to.
# These literals guard the on-disk / on-the-wire format: if one changes, an old
# journal, snapshot or audit trail no longer reads the same.  Do not "fix" them
# by pasting new output; add a new record version instead.
GOLDEN = {
    "AllocateProducerIdsRecord": (
        AllocateProducerIdsRecord(broker_id=3, broker_epoch=17, producer_id_start=123000, producer_id_len=1000,
                                  timestamp_ms=TS),
        "930100950311ce0001e078cd03e8cf0000018bcfe56800",
    ),
    "RegisterBrokerRecord": (
        RegisterBrokerRecord(broker_id=3, incarnation_id=INCARNATION, broker_epoch=17, listener="10.0.0.3:9092",
                             timestamp_ms=TS),
        "9302009503d92436663163306135322d386131652d346430622d396135352d32623966336531643763313011"
        "ad31302e302e302e333a39303932cf0000018bcfe56800",
    ),
    "FenceBrokerRecord": (
        FenceBrokerRecord(broker_id=3, broker_epoch=17, timestamp_ms=TS + 1),
        "930300930311cf0000018bcfe56801",
    ),
    "UnfenceBrokerRecord": (
        UnfenceBrokerRecord(broker_id=3, broker_epoch=17, timestamp_ms=TS + 2),
        "930400930311cf0000018bcfe56802",
    ),
    "UnregisterBrokerRecord": (
        UnregisterBrokerRecord(broker_id=3, broker_epoch=17, timestamp_ms=TS + 3),
        "930500930311cf0000018bcfe56803",
    ),
    "ProducerIdCursorRecord": (
        ProducerIdCursorRecord(next_producer_id=124000),
        "93060091ce0001e460",
    ),
    "BrokerEpochCursorRecord": (
        BrokerEpochCursorRecord(last_broker_epoch=17),
        "9307009111",
    ),
    "TransactionalIdRecord": (
        TransactionalIdRecord(transactional_id="orders-tx-1", producer_id=5000, producer_epoch=3,
                              last_producer_id=5000, last_producer_epoch=2, timeout_ms=60000, state="Empty",
                              update_time_ms=TS, broker_id=3, init_request="3:17:1"),
        "9308019aab6f72646572732d74782d31cd138803cd138802cdea60a5456d707479cf0000018bcfe5680003a6333a31373a31",
    ),
    "RemoveTransactionalIdRecord": (
        RemoveTransactionalIdRecord(transactional_id="orders-tx-1", producer_id=5000, timestamp_ms=TS + 4),
        "93090093ab6f72646572732d74782d31cd1388cf0000018bcfe56804",
    ),
    "ProducerIdSeedRecord": (
        ProducerIdSeedRecord(next_producer_id=5000, origin="export:zk.json", zk_broker=35, zk_block_start=4000,
                             zk_block_end=4999, timestamp_ms=TS + 5),
        "930a0096cd1388ae6578706f72743a7a6b2e6a736f6e23cd0fa0cd1387cf0000018bcfe56805",
    ),
    "MigrationStateRecord": (
        MigrationStateRecord(mode="bridge", zk="127.0.0.1:2181/kafka", timestamp_ms=TS + 6),
        "930b0093a6627269646765b43132372e302e302e313a323138312f6b61666b61cf0000018bcfe56806",
    ),
    "BridgeReservationRecord": (
        BridgeReservationRecord(reserved_start=5000, reserved_end=5999, broker_id=3, zk_version=7, timestamp_ms=TS + 7),
        "930c0095cd1388cd176f0307cf0000018bcfe56807",
    ),
    "MigrationCursorRecord": (
        MigrationCursorRecord(mode="bridge", zk="127.0.0.1:2181/kafka", reserved_until=6000),
        "930d0093a6627269646765b43132372e302e302e313a323138312f6b61666b61cd1770",
    ),
    "AclRecord": (
        AclRecord(principal="User:broker", resource_type="Cluster", resource_name="kafka-cluster",
                  pattern_type="LITERAL", operation="CLUSTER_ACTION", permission="ALLOW", host="*", timestamp_ms=TS),
        "930e0098ab557365723a62726f6b6572a7436c7573746572ad6b61666b612d636c7573746572a74c49544552414cae434c5553"
        "5445525f414354494f4ea5414c4c4f57a12acf0000018bcfe56800",
    ),
    "RemoveAclRecord": (
        RemoveAclRecord(principal="User:alice", resource_type="TransactionalId", resource_name="orders-",
                        pattern_type="PREFIXED", operation="WRITE", permission="DENY", host="10.0.0.7",
                        timestamp_ms=TS),
        "930f0098aa557365723a616c696365af5472616e73616374696f6e616c4964a76f72646572732da85052454649584544a55752"
        "495445a444454e59a831302e302e302e37cf0000018bcfe56800",
    ),
    "ClientQuotaRecord": (
        ClientQuotaRecord(user="alice", key="producer_ids_rate", value=2.5, remove=False, timestamp_ms=TS + 8),
        # ... cb 4004000000000000: the value is always a msgpack float64 (2.5), never an int
        "93100095a5616c696365b170726f64756365725f6964735f72617465cb4004000000000000c2cf0000018bcfe56808",
    ),
    "TransactionStateRecord": (
        TransactionStateRecord(transactional_id="orders-tx-1", producer_id=5000, producer_epoch=2,
                               state="PrepareCommit", partitions='[[1,"orders",0],[1,"orders",3]]',
                               start_time_ms=TS, update_time_ms=TS + 9, broker_id=1, sequence=7),
        "93110199ab6f72646572732d74782d31cd138802ad50726570617265436f6d6d6974bf5b5b312c226f7264657273222c305d2c"
        "5b312c226f7264657273222c335d5dcf0000018bcfe56800cf0000018bcfe568090107",
    ),
    "ProducerIdHistoryRecord": (
        ProducerIdHistoryRecord(lowest_issued=5000, issued_before_seed=False, seeded=True),
        # [18, 0, [5000, false, true]]
        "93120093cd1388c2c3",
    ),
}

GOLDEN_PAYLOADS = {
    "AuditEntry": (
        AuditEntry(raft_index=42, raft_term=7, position=1, accepted=False, error="boom",
                   record="AllocateProducerIdsRecord"),
        "936400962a0701c2a4626f6f6db9416c6c6f6361746550726f64756365724964735265636f7264",
    ),
    "AuditGap": (
        AuditGap(raft_index=41),
        "9365009129",
    ),
    "InitTransactionalProducerRequest": (
        InitTransactionalProducerRequest(broker_id=3, broker_epoch=17, transactional_id="orders-tx-1",
                                         transaction_timeout_ms=60000, producer_id=5000, producer_epoch=2,
                                         request_id="3:17:1"),
        "936601970311ab6f72646572732d74782d31cdea60cd138802a6333a31373a31",
    ),
    "InitTransactionalProducerResponse": (
        InitTransactionalProducerResponse(error_code=90, error_message="fenced", producer_id=-1, producer_epoch=-1),
        "936701955aa666656e636564ffffff",
    ),
    "DescribeTransactionalIdRequest": (
        DescribeTransactionalIdRequest(transactional_id="orders-tx-1"),
        "93680091ab6f72646572732d74782d31",
    ),
    "DescribeTransactionalIdResponse": (
        DescribeTransactionalIdResponse(error_code=0, error_message=None, producer_id=5000, producer_epoch=3,
                                        state="Empty"),
        "9369009500c0cd138803a5456d707479",
    ),
    "SeedProducerIdsRequest": (
        SeedProducerIdsRequest(next_producer_id=5000, origin="export:zk.json", zk_broker=35, zk_block_start=4000,
                               zk_block_end=4999),
        "936a0095cd1388ae6578706f72743a7a6b2e6a736f6e23cd0fa0cd1387",
    ),
    "SeedProducerIdsResponse": (
        SeedProducerIdsResponse(error_code=0, error_message=None, changed=True, next_producer_id=5000),
        "936b009400c0c3cd1388",
    ),
    "MigrationCommandRequest": (
        MigrationCommandRequest(action="bridge", zk="127.0.0.1:2181/kafka"),
        "936c0092a6627269646765b43132372e302e302e313a323138312f6b61666b61",
    ),
    "MigrationCommandResponse": (
        MigrationCommandResponse(error_code=0, error_message=None, mode="bridge", changed=True, next_producer_id=5000,
                                 message="ok"),
        "936d009600c0a6627269646765c3cd1388a26f6b",
    ),
    "AlterAclsRequest": (
        AlterAclsRequest(action="add", principal="User:alice", resource_type="TransactionalId", resource_name="*",
                         pattern_type="LITERAL", operation="WRITE", permission="ALLOW", host="*"),
        "936e0098a3616464aa557365723a616c696365af5472616e73616374696f6e616c4964a12aa74c49544552414ca557524954"
        "45a5414c4c4f57a12a",
    ),
    "AlterAclsResponse": (
        AlterAclsResponse(error_code=0, error_message=None, changed=True),
        "936f009300c0c3",
    ),
    "DescribeAclsRequest": (
        DescribeAclsRequest(principal="User:alice"),
        "93700091aa557365723a616c696365",
    ),
    "DescribeAclsResponse": (
        DescribeAclsResponse(error_code=31, error_message="denied", acls="[]", applied_index=42),
        "937100941fa664656e696564a25b5d2a",
    ),
    "AlterClientQuotaRequest": (
        AlterClientQuotaRequest(user=None, key="producer_ids_rate", value=0.5, remove=False, validate_only=True),
        "93730095c0b170726f64756365725f6964735f72617465cb3fe0000000000000c2c3",
    ),
    "AlterClientQuotaResponse": (
        AlterClientQuotaResponse(error_code=42, error_message="rate must be finite", changed=False),
        "937400932ab372617465206d7573742062652066696e697465c2",
    ),
    "TransactionRequest": (
        TransactionRequest(broker_id=3, broker_epoch=17, op="add", transactional_id="orders-tx-1", producer_id=5000,
                           producer_epoch=2, partitions='[[3,"orders",0]]', sequence=8),
        "9375019a0311a3616464ab6f72646572732d74782d31cd138802b05b5b332c226f7264657273222c305d5dff6408",
    ),
    "TransactionResponse": (
        TransactionResponse(error_code=51, error_message="busy"),
        "9376009433a462757379a0a25b5d",
    ),
    "BlockHistoryRequest": (
        BlockHistoryRequest(after_raft_index=42, after_position=1, cursor_offset=4096, limit=500, broker_id=3),
        "937700952a01cd1000cd01f403",
    ),
    "BlockHistoryResponse": (
        BlockHistoryResponse(error_code=0, node_id=2, applied_index=50, trail_index=49, blocks="[]", gaps="[[0,7]]",
                             next_raft_index=49, next_position=0, next_offset=8192, more=True),
        "9378009b00c0023231a25b5da75b5b302c375d5d3100cd2000c3",
    ),
}

ALL_INSTANCES = [rec for rec, _ in GOLDEN.values()] + [rec for rec, _ in GOLDEN_PAYLOADS.values()]


def _ids(recs):
    return [r.SPEC.name for r in recs]
