"""Every record and RPC payload pidquorum stores or sends, described once, as data.

The msgpack codec (``records.codec``), ``-o json`` output, the snapshot
contents and the audit trail all derive from these descriptions; nothing else
lists a record's fields.

Compatibility rule (checked by ``validate_spec`` and the golden-bytes tests):
a new version of a record may only *append* fields, and every field added
after version 0 must carry a default, so a reader of version N decodes any
version <= N.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
TYPES = set(INT_RANGES) | {"string", "bool", "nullable_string", "float64"}

LONG_MAX = 2**63 - 1


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str
    doc: str
    default: Any = REQUIRED
    since: int = 0  # record version that introduced the field

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class RecordSpec:
    name: str
    type_id: int
    version: int
    doc: str
    fields: tuple[FieldSpec, ...] = field(default_factory=tuple)

    def fields_at(self, version: int) -> tuple[FieldSpec, ...]:
        return tuple(f for f in self.fields if f.since <= version)


def validate_spec(spec: RecordSpec) -> None:
    seen = set()
    last_since = 0
    for f in spec.fields:
        if f.type not in TYPES:
            raise ValueError(f"{spec.name}.{f.name}: unknown type {f.type!r}")
        if f.name in seen:
            raise ValueError(f"{spec.name}.{f.name}: duplicate field")
        seen.add(f.name)
        if f.since < last_since:
            raise ValueError(f"{spec.name}.{f.name}: fields must be appended in version order")
        last_since = f.since
        if f.since > 0 and f.required:
            raise ValueError(f"{spec.name}.{f.name}: a field added in version {f.since} needs a default")
        if f.since > spec.version:
            raise ValueError(f"{spec.name}.{f.name}: since {f.since} > record version {spec.version}")


def record(name: str, type_id: int, doc: str, *fields: FieldSpec, version: int = 0) -> RecordSpec:
    return RecordSpec(name=name, type_id=type_id, version=version, doc=doc, fields=fields)


def answer(name: str, type_id: int, doc: str, *fields: FieldSpec, version: int = 0) -> RecordSpec:
    """An RPC's answer: a Kafka error code and its message come first, then the answer's own fields."""
    return record(name, type_id, doc, ERROR_CODE, ERROR_MESSAGE, *fields, version=version)


# Fields that several records share, word for word.
ERROR_CODE = FieldSpec("error_code", "int16", "Kafka error code (0: none).")
ERROR_MESSAGE = FieldSpec("error_message", "nullable_string", "Why, when error_code is not 0.", default=None)
AUDIT_TIME = FieldSpec("timestamp_ms", "int64", "Proposer's wall clock (ms); audit only.", default=-1)
BROKER_ID = FieldSpec("broker_id", "int32", "Broker ID.")
COORDINATOR_ID = FieldSpec("broker_id", "int32", "The coordinator broker.")
COORDINATOR_EPOCH = FieldSpec("broker_epoch", "int64", "Its current broker epoch.")
TRANSACTIONAL_ID_FIELD = FieldSpec("transactional_id", "string", "The client's transactional.id.")
MIGRATION_MODE = FieldSpec("mode", "string", "bridge | finalized | rolled-back.")
# An access-control entry as AclRecord adds it and RemoveAclRecord removes it.
ACL_ENTRY = (
    FieldSpec("principal", "string", "User:<name>, or User:* for every principal."),
    FieldSpec("resource_type", "string", "Cluster | TransactionalId | Topic | Group."),
    FieldSpec("resource_name", "string",
              "kafka-cluster for the cluster; a transactional id or topic, a prefix, or '*'."),
    FieldSpec("pattern_type", "string", "LITERAL (the name '*' matches every name) | PREFIXED."),
    FieldSpec("operation", "string", "ALL | CLUSTER_ACTION | IDEMPOTENT_WRITE | READ | WRITE | DESCRIBE | ALTER."),
    FieldSpec("permission", "string", "ALLOW | DENY (a matching DENY wins)."),
    FieldSpec("host", "string", "Client address the entry applies to, '*' for any.", default="*"),
    FieldSpec("timestamp_ms", "int64", "Proposer's wall clock (ms); audit only, never read by replay.", default=-1),
)


# --------------------------------------------------------------------------
# Replicated records (the Raft log, snapshots and the audit trail)
# --------------------------------------------------------------------------

ALLOCATE_PRODUCER_IDS = record(
    "AllocateProducerIdsRecord", 1,
    "One block of producer IDs handed to one broker: the IDs "
    "[producer_id_start, producer_id_start + producer_id_len). "
    "The next block starts at producer_id_start + producer_id_len, which is "
    "what Kafka's ProducerIdsRecord stores as NextProducerId (an exclusive end). "
    "Every record stands alone for audit: which broker, which epoch, which range.",
    FieldSpec("broker_id", "int32", "Broker the block was issued to."),
    FieldSpec("broker_epoch", "int64", "That broker's epoch when the block was issued."),
    FieldSpec("producer_id_start", "int64", "First ID of the block (inclusive)."),
    FieldSpec("producer_id_len", "int32", "Number of IDs in the block."),
    FieldSpec("timestamp_ms", "int64", "Proposer's wall clock (ms since epoch); audit only, never read by replay.", default=-1),
)

REGISTER_BROKER = record(
    "RegisterBrokerRecord", 2,
    "A broker (re-)registered; it holds broker_epoch until it registers again or is unregistered.",
    BROKER_ID,
    FieldSpec("incarnation_id", "string", "Identifies one run of the broker process (a UUID)."),
    FieldSpec("broker_epoch", "int64", "Epoch assigned to this registration; strictly increasing across the cluster."),
    FieldSpec("listener", "string", "host:port the broker serves clients on.", default=""),
    AUDIT_TIME,
)

FENCE_BROKER = record(
    "FenceBrokerRecord", 3,
    "A registered broker asked to be fenced (or was fenced by an operator); it stays registered.",
    BROKER_ID,
    FieldSpec("broker_epoch", "int64", "Epoch of the registration being fenced."),
    AUDIT_TIME,
)

UNFENCE_BROKER = record(
    "UnfenceBrokerRecord", 4,
    "A broker heartbeated without asking to be fenced: it is unfenced, and its session (which holds its "
    "broker id against another incarnation) runs from timestamp_ms.",
    BROKER_ID,
    FieldSpec("broker_epoch", "int64", "Epoch of the registration being unfenced."),
    FieldSpec("timestamp_ms", "int64", "Proposer's wall clock (ms): the heartbeat's time, which replay keeps "
              "as the session's start (never moved back).", default=-1),
)

UNREGISTER_BROKER = record(
    "UnregisterBrokerRecord", 5,
    "A broker shut down or was removed; its epoch is no longer valid.",
    BROKER_ID,
    FieldSpec("broker_epoch", "int64", "Epoch of the registration being removed."),
    AUDIT_TIME,
)

PRODUCER_ID_CURSOR = record(
    "ProducerIdCursorRecord", 6,
    "Snapshot-only record: the next producer ID to issue, for a state that has a "
    "cursor but no block record to carry it (never written to the log).",
    FieldSpec("next_producer_id", "int64", "First ID of the next block."),
)

BROKER_EPOCH_CURSOR = record(
    "BrokerEpochCursorRecord", 7,
    "Snapshot-only record: the highest broker epoch ever assigned, so epochs never repeat after a snapshot.",
    FieldSpec("last_broker_epoch", "int64", "Highest epoch assigned so far."),
)

TRANSACTIONAL_ID = record(
    "TransactionalIdRecord", 8,
    "The transaction coordinator's state for one transactional id after an "
    "InitProducerId (KIP-360 rules): its current producer ID and epoch, and the "
    "(producer ID, epoch) it replaced, so a retried bump is recognised and "
    "answered with the current epoch instead of bumping twice.  Within one "
    "transactional id, (producer_id, producer_epoch) only ever increases.",
    TRANSACTIONAL_ID_FIELD,
    FieldSpec("producer_id", "int64", "Current producer ID."),
    FieldSpec("producer_epoch", "int16", "Current epoch (0..32766; 32767 is kept back for fencing)."),
    FieldSpec("last_producer_id", "int64", "Producer ID before the last change (-1: none).", default=-1),
    FieldSpec("last_producer_epoch", "int16", "Epoch before the last change (-1: none).", default=-1),
    FieldSpec("timeout_ms", "int32", "transaction.timeout.ms the producer asked for."),
    FieldSpec("state", "string", "Always Empty (the transaction is a TransactionStateRecord).",
              default="Empty"),
    FieldSpec("update_time_ms", "int64", "Proposer's wall clock at the change; drives expiration."),
    FieldSpec("broker_id", "int32", "Broker (coordinator) that asked for the change; audit only.", default=-1),
    FieldSpec("init_request", "string", "The InitProducerId request whose answer this state is "
              "(request_id/producer_id/producer_epoch, as it asked): a copy of that request delivered "
              "again is answered with it, not bumped twice.  '' when a coordinator's abort or an older "
              "broker made the change.", default="", since=1),
    version=1,
)

REMOVE_TRANSACTIONAL_ID = record(
    "RemoveTransactionalIdRecord", 9,
    "A transactional id idle longer than transactional.id.expiration.ms was forgotten.",
    FieldSpec("transactional_id", "string", "The expired transactional.id."),
    FieldSpec("producer_id", "int64", "Its producer ID at expiry (replay checks it still matches)."),
    AUDIT_TIME,
)

PRODUCER_ID_SEED = record(
    "ProducerIdSeedRecord", 10,
    "Migration from ZooKeeper: moves the producer-ID cursor up to next_producer_id, "
    "which is ZooKeeper's last block_end + 1 (block_end is inclusive), so the quorum "
    "never issues an ID ZooKeeper already handed out (Kafka's first migration seeded "
    "the block's start and issued a block twice, KAFKA-15552).  Never moves the cursor "
    "back.  Carries where the block came from, for the audit trail.",
    FieldSpec("next_producer_id", "int64", "First ID the quorum may issue from now on."),
    FieldSpec("origin", "string", "Where the ZooKeeper block was read: 'export:<file>' or 'zookeeper:<hosts>'."),
    FieldSpec("zk_broker", "int32", "The broker field of the ZooKeeper block."),
    FieldSpec("zk_block_start", "int64", "block_start of the ZooKeeper block."),
    FieldSpec("zk_block_end", "int64", "block_end of the ZooKeeper block (inclusive)."),
    AUDIT_TIME,
)

MIGRATION_STATE = record(
    "MigrationStateRecord", 11,
    "The ZooKeeper migration's mode.  bridge: ZooKeeper-mode brokers still allocate, so "
    "every ID range the quorum issues is first reserved in the znode (at zk) with a "
    "conditional update; finalized: every broker is on the quorum, the znode is no longer "
    "written; rolled-back: ZooKeeper allocates again (from a placeholder above everything "
    "the quorum issued) and the quorum issues nothing.",
    MIGRATION_MODE,
    FieldSpec("zk", "string", "ZooKeeper connect string (HOST:PORT[,...][/chroot]) of the znode."),
    AUDIT_TIME,
)

BRIDGE_RESERVATION = record(
    "BridgeReservationRecord", 12,
    "Bridge mode: the range [reserved_start, reserved_end] was written to the znode (a "
    "conditional update) before this entry was proposed; the cursor moves up to "
    "reserved_start and the allocations that follow in the same entry must lie inside it.",
    FieldSpec("reserved_start", "int64", "First ID of the reserved range."),
    FieldSpec("reserved_end", "int64", "Last ID of the reserved range (inclusive, as in the znode)."),
    FieldSpec("broker_id", "int32", "Broker the range was reserved for (written to the znode)."),
    FieldSpec("zk_version", "int32", "The znode's version after the write; audit only.", default=-1),
    AUDIT_TIME,
)

MIGRATION_CURSOR = record(
    "MigrationCursorRecord", 13,
    "Snapshot-only record: the migration mode, its znode, and how far bridge mode has reserved.",
    MIGRATION_MODE,
    FieldSpec("zk", "string", "ZooKeeper connect string of the znode."),
    FieldSpec("reserved_until", "int64", "Exclusive end of the ranges reserved in the znode (bridge mode)."),
)

PRODUCER_ID_HISTORY = record(
    "ProducerIdHistoryRecord", 18,
    "Snapshot-only record, after the latest block or cursor: what the quorum issued before, which a "
    "ZooKeeper seed is checked against.  A quorum that issued producer IDs before its first seed "
    "may have issued IDs ZooKeeper issued too, so a seed whose ZooKeeper range (0..block_end) reaches "
    "them is refused.  Written only when it says more than its absence: a snapshot without it is read "
    "as 'nothing issued' when it holds no block, else as 'issued from 0, before any seed' (the "
    "conservative reading of a snapshot written before this record existed).",
    FieldSpec("lowest_issued", "int64", "Lowest producer ID the quorum ever issued (-1: none)."),
    FieldSpec("issued_before_seed", "bool", "Some IDs were issued before the first ProducerIdSeedRecord."),
    FieldSpec("seeded", "bool", "A ProducerIdSeedRecord was applied."),
)

ACL = record(
    "AclRecord", 14,
    "An access-control entry was added (pidctl acl add).  Entries are identified by all "
    "their fields but the timestamp; the quorum and the brokers authorize requests with them "
    "(quorum/security/acl.py).  Also the snapshot form of every live entry.",
    *ACL_ENTRY,
)

REMOVE_ACL = record(
    "RemoveAclRecord", 15,
    "An access-control entry was removed (pidctl acl remove); replay checks it exists.",
    *ACL_ENTRY,
)

CLIENT_QUOTA = record(
    "ClientQuotaRecord", 16,
    "A client quota set or removed for one user, or for the user default (user null), "
    "like Kafka's ClientQuotaRecord and its /config/users/<user> and /config/users/<default>. "
    "Keys: producer_ids_rate (KIP-936: new producer IDs per second a principal may start "
    "producing with).  Snapshots carry the live quotas as these records again (remove false).",
    FieldSpec("user", "nullable_string", "The user (principal name without 'User:'); null: the default."),
    FieldSpec("key", "string", "The quota key (producer_ids_rate)."),
    FieldSpec("value", "float64", "The quota value; ignored when remove is true.", default=0.0),
    FieldSpec("remove", "bool", "True: the key is removed from the entity.", default=False),
    AUDIT_TIME,
)

TRANSACTION_STATE = record(
    "TransactionStateRecord", 17,
    "The transaction coordinator's state for one transactional id's current transaction "
    "(KIP-98), kept in the quorum like its producer ID and epoch, so whichever broker picks "
    "the id up after a crash completes a prepared commit or abort: "
    "Ongoing -> PrepareCommit | PrepareAbort -> CompleteCommit | CompleteAbort, then "
    "Ongoing again.  producer_id/producer_epoch are those the markers are written with and "
    "always equal the id's current TransactionalIdRecord (a timeout abort bumps the epoch "
    "in the same entry).  sequence numbers the id's transactions: every step names the "
    "transaction it is for, and a step for another one is refused.",
    TRANSACTIONAL_ID_FIELD,
    FieldSpec("producer_id", "int64", "Producer ID of the transaction."),
    FieldSpec("producer_epoch", "int16", "Epoch of the transaction and of its markers."),
    FieldSpec("state", "string", "Ongoing | PrepareCommit | PrepareAbort | CompleteCommit | CompleteAbort."),
    FieldSpec("partitions", "string",
              "The partitions added, a JSON array of [broker_id, topic, partition], sorted."),
    FieldSpec("start_time_ms", "int64", "Proposer's wall clock when the transaction began; its timeout "
              "runs from here and it identifies the transaction."),
    FieldSpec("update_time_ms", "int64", "Proposer's wall clock at this change."),
    FieldSpec("broker_id", "int32", "Broker that asked for the change; audit only.", default=-1),
    FieldSpec("sequence", "int64", "The transaction's number among the id's transactions: the one "
              "before it plus 1 (0 for the first, or after the id was forgotten); -1 in a record "
              "written before v1.", default=-1, since=1),
    version=1,
)

RECORDS: tuple[RecordSpec, ...] = (
    ALLOCATE_PRODUCER_IDS,
    REGISTER_BROKER,
    FENCE_BROKER,
    UNFENCE_BROKER,
    UNREGISTER_BROKER,
    PRODUCER_ID_CURSOR,
    BROKER_EPOCH_CURSOR,
    TRANSACTIONAL_ID,
    REMOVE_TRANSACTIONAL_ID,
    PRODUCER_ID_SEED,
    MIGRATION_STATE,
    BRIDGE_RESERVATION,
    MIGRATION_CURSOR,
    ACL,
    REMOVE_ACL,
    CLIENT_QUOTA,
    TRANSACTION_STATE,
    PRODUCER_ID_HISTORY,
)

# --------------------------------------------------------------------------
# Payloads that are not log records
# --------------------------------------------------------------------------

AUDIT_ENTRY = record(
    "AuditEntry", 100,
    "One line of a node's audit trail: a record the node applied, with the Raft "
    "index and term of the log entry that carried it, and whether replay accepted it.",
    FieldSpec("raft_index", "int64", "Log index of the entry."),
    FieldSpec("raft_term", "int64", "Term of the entry.", default=-1),
    FieldSpec("position", "int32", "Position of the record inside the entry."),
    FieldSpec("accepted", "bool", "False if replay refused the record (it changed nothing)."),
    FieldSpec("error", "nullable_string", "Why replay refused it.", default=None),
    FieldSpec("record", "string", "Record type name."),
)

AUDIT_GAP = record(
    "AuditGap", 101,
    "This node received entries up to raft_index as a snapshot, so its trail has no lines for them.",
    FieldSpec("raft_index", "int64", "Last index covered by the snapshot."),
)

INIT_TRANSACTIONAL_REQUEST = record(
    "InitTransactionalProducerRequest", 102,
    "pidquorum RPC (client port, API key 10002, msgpack): a broker acting as "
    "transaction coordinator asks the quorum to apply InitProducerId to a "
    "transactional id.  The state lives in the quorum, so a broker failover "
    "never loses or repeats an epoch bump.",
    COORDINATOR_ID,
    COORDINATOR_EPOCH,
    TRANSACTIONAL_ID_FIELD,
    FieldSpec("transaction_timeout_ms", "int32", "The client's transaction.timeout.ms."),
    FieldSpec("producer_id", "int64", "Expected current producer ID (KIP-360), -1 for none.", default=-1),
    FieldSpec("producer_epoch", "int16", "Expected current epoch, -1 for none.", default=-1),
    FieldSpec("request_id", "string", "Names this InitProducerId of the coordinator's (the same in every "
              "copy and retry of it; '' none): a copy delivered after it was applied gets the answer it "
              "got, instead of fencing the producer it answered.", default="", since=1),
    version=1,
)

INIT_TRANSACTIONAL_RESPONSE = answer(
    "InitTransactionalProducerResponse", 103,
    "The answer to InitTransactionalProducerRequest.",
    FieldSpec("producer_id", "int64", "The producer ID to use.", default=-1),
    FieldSpec("producer_epoch", "int16", "The epoch to use.", default=-1),
    FieldSpec("txn_sequence", "int64", "The sequence of the id's last transaction (none is open once "
              "InitProducerId is answered): the producer's next transaction is this plus 1; -1 if the "
              "id has had none.", default=-1, since=1),
    version=1,
)

DESCRIBE_TRANSACTIONAL_REQUEST = record(
    "DescribeTransactionalIdRequest", 104,
    "pidquorum RPC (API key 10002, msgpack): a coordinator broker reads a transactional "
    "id's current producer ID and epoch, linearizably (through the leader and the log), "
    "to fence an older instance on its transactional requests.",
    TRANSACTIONAL_ID_FIELD,
)

DESCRIBE_TRANSACTIONAL_RESPONSE = answer(
    "DescribeTransactionalIdResponse", 105,
    "The answer to DescribeTransactionalIdRequest; producer_id -1 if the id is unknown (or expired).",
    FieldSpec("producer_id", "int64", "Current producer ID, -1 if none.", default=-1),
    FieldSpec("producer_epoch", "int16", "Current epoch, -1 if none.", default=-1),
    FieldSpec("state", "string", "Transaction state.", default=""),
)

SEED_REQUEST = record(
    "SeedProducerIdsRequest", 106,
    "pidquorum RPC (API key 10002, msgpack): `pidctl migrate from-zk` asks the quorum to commit a seed.",
    FieldSpec("next_producer_id", "int64", "ZooKeeper's block_end + 1."),
    FieldSpec("origin", "string", "Where the block was read."),
    FieldSpec("zk_broker", "int32", "The ZooKeeper block's broker."),
    FieldSpec("zk_block_start", "int64", "The ZooKeeper block's start."),
    FieldSpec("zk_block_end", "int64", "The ZooKeeper block's end (inclusive)."),
)

SEED_RESPONSE = answer(
    "SeedProducerIdsResponse", 107,
    "The answer to SeedProducerIdsRequest: whether the cursor moved, and where it is now.",
    FieldSpec("changed", "bool", "True if a seed was committed; False if the cursor was already there or beyond.",
              default=False),
    FieldSpec("next_producer_id", "int64", "The quorum's next producer ID after the request.", default=-1),
)

MIGRATION_REQUEST = record(
    "MigrationCommandRequest", 108,
    "pidquorum RPC (API key 10002): `pidctl migrate bridge|finalize|rollback`.",
    FieldSpec("action", "string", "bridge | finalize | rollback."),
    FieldSpec("zk", "string", "ZooKeeper connect string (bridge; empty: keep the recorded one).", default=""),
)

MIGRATION_RESPONSE = answer(
    "MigrationCommandResponse", 109,
    "The answer to MigrationCommandRequest.",
    FieldSpec("mode", "string", "The migration mode afterwards ('' if none).", default=""),
    FieldSpec("changed", "bool", "False if the quorum was already in that mode.", default=False),
    FieldSpec("next_producer_id", "int64", "The quorum's next producer ID.", default=-1),
    FieldSpec("message", "string", "What was done (e.g. the placeholder written on rollback).", default=""),
)

ALTER_ACLS_REQUEST = record(
    "AlterAclsRequest", 110,
    "pidquorum RPC (API key 10002): `pidctl acl add|remove`; needs ALTER on the cluster.",
    FieldSpec("action", "string", "add | remove."),
    FieldSpec("principal", "string", "User:<name> or User:*."),
    FieldSpec("resource_type", "string", "Cluster | TransactionalId | Topic | Group."),
    FieldSpec("resource_name", "string", "kafka-cluster, a transactional id or topic, a prefix or '*'."),
    FieldSpec("pattern_type", "string", "LITERAL | PREFIXED.", default="LITERAL"),
    FieldSpec("operation", "string", "The operation."),
    FieldSpec("permission", "string", "ALLOW | DENY.", default="ALLOW"),
    FieldSpec("host", "string", "Client address, '*' for any.", default="*"),
)

ALTER_ACLS_RESPONSE = answer(
    "AlterAclsResponse", 111,
    "The answer to AlterAclsRequest.",
    FieldSpec("changed", "bool", "False if the entry was already there (add) or absent (remove).", default=False),
)

DESCRIBE_ACLS_REQUEST = record(
    "DescribeAclsRequest", 112,
    "pidquorum RPC (API key 10002): the ACL entries as the answering node has applied them "
    "(`pidctl acl list`; brokers poll it).  Needs DESCRIBE or CLUSTER_ACTION on the cluster.",
    FieldSpec("principal", "string", "Only this principal's entries ('': all).", default=""),
)

DESCRIBE_ACLS_RESPONSE = answer(
    "DescribeAclsResponse", 113,
    "The answer to DescribeAclsRequest.",
    FieldSpec("acls", "string", "The entries, a JSON array of objects with the AclRecord fields (no timestamp).",
              default="[]"),
    FieldSpec("applied_index", "int64", "The answering node's applied Raft index (how fresh the list is).",
              default=-1),
)

ALTER_CLIENT_QUOTA_REQUEST = record(
    "AlterClientQuotaRequest", 115,
    "pidquorum RPC (API key 10002): `pidctl quota set|delete` sets or removes one quota key of one user.",
    FieldSpec("user", "nullable_string", "The user; null: the default for every user without its own."),
    FieldSpec("key", "string", "The quota key (producer_ids_rate)."),
    FieldSpec("value", "float64", "The new value (finite, > 0); ignored when remove.", default=0.0),
    FieldSpec("remove", "bool", "Remove the key instead of setting it.", default=False),
    FieldSpec("validate_only", "bool", "Check the request, commit nothing.", default=False),
)

ALTER_CLIENT_QUOTA_RESPONSE = answer(
    "AlterClientQuotaResponse", 116,
    "The answer to AlterClientQuotaRequest.",
    FieldSpec("changed", "bool", "False if the quota already had that value (nothing committed).",
              default=False),
)

TRANSACTION_REQUEST = record(
    "TransactionRequest", 117,
    "pidquorum RPC (API key 10002): a broker acting as transaction coordinator changes or "
    "reads a transaction.  op: add (AddPartitionsToTxn), verify (KIP-890 part 1: is every "
    "partition in the ongoing transaction? nothing committed), commit / abort (EndTxn: "
    "Ongoing -> Prepare*), complete (every marker is written: Prepare* -> Complete*), "
    "timeout (the coordinator aborts a transaction past its timeout, bumping the epoch), "
    "describe (the id's transaction, read through the leader: InitProducerId answers "
    "CONCURRENT_TRANSACTIONS while one must be completed first), "
    "pending (answered by the node from its applied state: the transactions some broker "
    "must drive, prepared or past their timeout), "
    "list (answered by the leader from its applied state: every live transactional id, in id order, "
    "after transactional_id; a page of at most limit ids and about 1 MiB of JSON).",
    COORDINATOR_ID,
    COORDINATOR_EPOCH,
    FieldSpec("op", "string", "add | verify | commit | abort | complete | timeout | describe | pending | list."),
    FieldSpec("transactional_id", "string", "The client's transactional.id ('' for pending); list: the "
              "ids after this one (the last id of the previous page; '': from the first).", default=""),
    FieldSpec("producer_id", "int64", "The producer ID the client (or the transaction) has.", default=-1),
    FieldSpec("producer_epoch", "int16", "Its epoch.", default=-1),
    FieldSpec("partitions", "string", "add / verify: a JSON array of [broker_id, topic, partition].",
              default="[]"),
    FieldSpec("start_time_ms", "int64", "complete / timeout: the transaction meant (its start time).",
              default=-1),
    FieldSpec("limit", "int32", "pending, list: at most this many transactions.", default=100),
    FieldSpec("sequence", "int64", "The transaction the step is for (TransactionStateRecord.sequence): "
              "add names the open transaction, or the next one to begin; commit / abort / complete / "
              "timeout / verify the one they end or check.  A step for another transaction of the id is "
              "refused (INVALID_TXN_STATE), a repeated one answered as it was.  -1: the id's current "
              "transaction, whichever it is (a coordinator that has not learnt the sequence yet).",
              default=-1, since=1),
    version=1,
)

TRANSACTION_RESPONSE = answer(
    "TransactionResponse", 118,
    "The answer to TransactionRequest.",
    FieldSpec("transaction", "string", "The transaction after the change, a JSON object with the "
              "TransactionStateRecord fields plus timeout_ms ('' if none).", default=""),
    FieldSpec("transactions", "string", "pending, list: a JSON array of such objects (list: an id without "
              "a transaction, or initialized again since its last one ended, is state Empty with its producer).",
              default="[]"),
)

BLOCK_HISTORY_REQUEST = record(
    "BlockHistoryRequest", 119,
    "pidquorum RPC (API key 10002): a page of the blocks in the answering node's audit trail (every "
    "accepted AllocateProducerIdsRecord it applied, kept across log compaction), in Raft order "
    "(`pidctl blocks history` with --quorum).  Answered by the node itself, from its trail; needs "
    "DESCRIBE or CLUSTER_ACTION on the cluster.",
    FieldSpec("after_raft_index", "int64", "The cursor: blocks after the trail line (raft index, position) "
              "the last page ended at; -1: from the start.", default=-1),
    FieldSpec("after_position", "int32", "The cursor's position in its entry (-1 for a gap line).", default=-1),
    FieldSpec("cursor_offset", "int64", "Where the cursor's line is in the answering node's trail, as its last "
              "answer said (a hint: checked against the line there, else the node looks for the cursor "
              "itself); -1: unknown.", default=-1),
    FieldSpec("limit", "int32", "At most this many blocks (1..10000); a page also ends after about 1 MiB of "
              "trail read.", default=1000),
    FieldSpec("broker_id", "int32", "Only this broker's blocks (-1: every broker's).", default=-1),
)

BLOCK_HISTORY_RESPONSE = answer(
    "BlockHistoryResponse", 120,
    "The answer to BlockHistoryRequest.",
    FieldSpec("node_id", "int32", "The answering node.", default=-1),
    FieldSpec("applied_index", "int64", "Its applied Raft index when it answered.", default=-1),
    FieldSpec("trail_index", "int64", "The last Raft index of its trail this answer covers (the trail is "
              "written on apply, so it may be behind applied_index for a moment).", default=-1),
    FieldSpec("blocks", "string", "A JSON array of blocks: raft_index, raft_term and the "
              "AllocateProducerIdsRecord fields.", default="[]"),
    FieldSpec("gaps", "string", "A JSON array of [after_index, raft_index]: the node installed a snapshot "
              "at raft_index, so its trail has no entry after after_index up to raft_index (the other "
              "nodes' trails have them).", default="[]"),
    FieldSpec("next_raft_index", "int64", "The cursor for the next page: the last line read.", default=-1),
    FieldSpec("next_position", "int32", "Its position.", default=-1),
    FieldSpec("next_offset", "int64", "Its offset in this node's trail (the next request's cursor_offset).",
              default=-1),
    FieldSpec("more", "bool", "Lines of the trail up to trail_index remain after the cursor.", default=False),
)

PAYLOADS: tuple[RecordSpec, ...] = (AUDIT_ENTRY, AUDIT_GAP, INIT_TRANSACTIONAL_REQUEST, INIT_TRANSACTIONAL_RESPONSE,
                                    DESCRIBE_TRANSACTIONAL_REQUEST, DESCRIBE_TRANSACTIONAL_RESPONSE,
                                    SEED_REQUEST, SEED_RESPONSE, MIGRATION_REQUEST, MIGRATION_RESPONSE,
                                    ALTER_ACLS_REQUEST, ALTER_ACLS_RESPONSE, DESCRIBE_ACLS_REQUEST,
                                    DESCRIBE_ACLS_RESPONSE, ALTER_CLIENT_QUOTA_REQUEST,
                                    ALTER_CLIENT_QUOTA_RESPONSE, TRANSACTION_REQUEST, TRANSACTION_RESPONSE,
                                    BLOCK_HISTORY_REQUEST, BLOCK_HISTORY_RESPONSE)

for _spec in RECORDS + PAYLOADS:
    validate_spec(_spec)

BY_TYPE_ID: dict[int, RecordSpec] = {s.type_id: s for s in RECORDS + PAYLOADS}
BY_NAME: dict[str, RecordSpec] = {s.name: s for s in RECORDS + PAYLOADS}
if len(BY_TYPE_ID) != len(RECORDS + PAYLOADS):  # pragma: no cover - guarded at import
    raise RuntimeError("duplicate record type ids")
