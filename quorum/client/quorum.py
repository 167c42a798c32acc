"""Async client for the quorum's client port (used by pidctl, brokers, benchmarks, tests).

``QuorumClient`` sends each call to the node that answered last and, on a connection failure or a retriable
error, moves to the next node with backoff until the call's deadline (``RetryPolicy``).  With
``prefer_leader`` it also looks for the leader in the background and sends there: a follower would answer
too, but by forwarding, a second hop on every call.  A node no retry can reach (``HandshakeFailed``, see
``quorum.client.connection``) is not tried again; when every node is such, the call fails at once
(``QuorumUnreachableError``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping

from records import (
    AlterAclsRequest,
    AlterClientQuotaRequest,
    BlockHistoryRequest,
    DescribeAclsRequest,
    DescribeTransactionalIdRequest,
    InitTransactionalProducerRequest,
    MigrationCommandRequest,
    SeedProducerIdsRequest,
    TransactionRequest,
)
from quorum.security.acl import Acl
from records.wire import kafka
from records.wire.errors import (
    Errors,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    for_code,
)

from . import api
from .connection import Connection, ConnectionFailed, HandshakeFailed, SettingNames
from .leader import pick_leader, summary
from .retry import LEADER_POLL, RetryPolicy

log = logging.getLogger(__name__)


class QuorumUnreachableError(RequestTimedOutError):
    """No node can be reached with this client's settings (each raised ``HandshakeFailed``): raised at once,
    not after the deadline.  A RequestTimedOutError (the quorum is unavailable to this client) that no retry
    can cure."""

    @property
    def retriable(self) -> bool:
        return False


@dataclass
class AllocatedBlock:
    start: int
    length: int
    throttle_ms: int
    node: str

    @property
    def next_id(self) -> int:
        return self.start + self.length

    def to_dict(self) -> dict:
        return {"producer_id_start": self.start, "producer_id_len": self.length,
                "next_producer_id": self.next_id, "throttle_time_ms": self.throttle_ms, "node": self.node}


@dataclass
class BlockHistoryPage:
    """A page of one node's audit trail (``QuorumClient.block_history``): its blocks in Raft order (the
    dicts of ``pidctl blocks history -o json``), the (after_index, raft_index] ranges its trail has no entry
    of (a snapshot it installed: the other nodes' trails have them), the node's applied index and the last
    Raft index the page covers, and the cursor the next page starts after."""
    address: str
    node_id: int
    applied_index: int
    trail_index: int
    blocks: list[dict]
    gaps: list[tuple[int, int]]
    cursor: tuple[int, int, int]
    more: bool


@dataclass
class QuorumClient:
    addresses: list[str]
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    client_id: str = "pidquorum"
    security: Any = None  # quorum.security.client.ClientSecurity (SASL / TLS), None: PLAINTEXT
    prefer_leader: bool = False  # find the leader in the background and send there (brokers do)
    names: SettingNames = field(default_factory=SettingNames)  # the settings its errors name as the fix

    def __post_init__(self) -> None:
        if not self.addresses:
            raise ValueError("no quorum addresses given")
        self._conns: dict[str, Connection] = {}
        self._preferred = 0
        self._leader_checked: float | None = None  # loop time of the last look for the leader
        self._leader_task: asyncio.Task | None = None
        self.leader_moves = 0  # times a look for the leader moved this client to another node

    def _look_for_leader(self) -> None:
        """Start a background look for the leader when one is due (never on the caller's path)."""
        if not self.prefer_leader or len(self.addresses) < 2:
            return
        if self._leader_task is not None and not self._leader_task.done():
            return
        now = asyncio.get_running_loop().time()
        if self._leader_checked is not None and now - self._leader_checked < LEADER_RECHECK_S:
            return
        self._leader_checked = now
        self._leader_task = asyncio.get_running_loop().create_task(self._prefer_leader())

    async def _prefer_leader(self) -> None:
        try:
            # Asked again (LEADER_POLL) while no node says it leads, up to the next look: a client that
            # starts with the cluster, or during an election, would otherwise stay on a follower (every
            # call forwarded) until LEADER_RECHECK_S later.
            leader, _ = await self.find_leader(LEADER_RECHECK_S)
        except Exception as e:  # noqa: BLE001 - no leader now, not allowed DescribeState, ...: stay where it is
            log.debug("looking for the quorum leader: %s", e)
            return
        if leader in self.addresses and self.addresses[self._preferred] != leader:
            self._preferred = self.addresses.index(leader)
            self.leader_moves += 1

    def _conn(self, address: str) -> Connection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = Connection(address, self.client_id, self.security, self.names)
        return conn

    async def _call_any(self, body: Any) -> tuple[Any, str]:
        self._look_for_leader()
        backoff = self.policy.start()
        attempt = 0
        errors: dict[str, str] = {}  # each node's latest error
        hopeless: set[str] = set()  # the nodes another try cannot reach (HandshakeFailed): not tried again
        n = len(self.addresses)
        while True:
            address = self.addresses[(self._preferred + attempt) % n]
            try:
                if address in hopeless:
                    pass
                else:
                    resp = await self._conn(address).call(body, min(self.policy.attempt_timeout,
                                                                     max(backoff.remaining(), 0.01)))
                    code = Errors.of(int(resp["error_code"] if isinstance(resp, dict) else resp.error_code))
                    message = getattr(resp, "error_message", None) if not isinstance(resp, dict) else None
                    if code == Errors.NONE:
                        self._preferred = (self._preferred + attempt) % n
                        if attempt:  # it had to move: the leader may have changed
                            self._leader_checked = None
                            self._look_for_leader()
                        return resp, address
                    throttle = _throttle_ms(resp)
                    err = for_code(code, f"{address}: {message or code.name}", throttle)
                    if not err.retriable or code == Errors.CONCURRENT_TRANSACTIONS:
                        raise err  # CONCURRENT_TRANSACTIONS: the Kafka client it is for retries it, not this one
                    errors[address] = f"{address}: {code.name}"
                    if code == Errors.THROTTLING_QUOTA_EXCEEDED and throttle:
                        await asyncio.sleep(min(throttle / 1000, backoff.remaining()))
            except HandshakeFailed as e:
                errors[address] = str(e)
                hopeless.add(address)
                if hopeless >= set(self.addresses):
                    raise QuorumUnreachableError(unreachable("no node answered", errors)) from None
            except (ConnectionFailed, RequestTimedOutError) as e:
                errors[address] = str(e)
            attempt += 1
            if not backoff.expired and (attempt % n or await backoff.sleep()):  # after each round: back off
                continue
            if backoff.expired:
                raise RequestTimedOutError(unreachable(f"no node answered within {self.policy.timeout:.1f}s", errors))
            raise RequestTimedOutError(unreachable(f"no node answered in {backoff.attempts + 1} rounds", errors))

    async def register_broker(self, broker_id: int, incarnation_id: uuid.UUID | None = None,
                              listener: str = "") -> int:
        resp, _ = await self._call_any(api.registration_request(broker_id, incarnation_id or uuid.uuid4(), listener))
        return int(resp.broker_epoch)

    async def heartbeat(self, broker_id: int, broker_epoch: int, want_fence: bool = False,
                        want_shut_down: bool = False) -> dict:
        resp, _ = await self._call_any(api.heartbeat_request(broker_id, broker_epoch, want_fence, want_shut_down))
        return {"is_fenced": resp.is_fenced, "should_shut_down": resp.should_shut_down}

    async def allocate(self, broker_id: int, broker_epoch: int) -> AllocatedBlock:
        resp, node = await self._call_any(api.allocate_request(broker_id, broker_epoch))
        return AllocatedBlock(int(resp.producer_id_start), int(resp.producer_id_len), _throttle_ms(resp), node)

    async def init_transactional(self, broker_id: int, broker_epoch: int, transactional_id: str,
                                 transaction_timeout_ms: int, producer_id: int = -1,
                                 producer_epoch: int = -1) -> tuple[int, int]:
        """InitProducerId for a transactional id, decided and stored by the quorum: (producer id, epoch).

        Raises ProducerFencedError, InvalidTransactionTimeoutError, StaleBrokerEpochError ...
        (not retried) or RequestTimedOutError after the policy's timeout; ConcurrentTransactionsError while
        a transaction of the id must be completed first (``txn(..., "describe", ...)`` says which).
        """
        pid, epoch, _ = await self.init_transactional_sequence(broker_id, broker_epoch, transactional_id,
                                                               transaction_timeout_ms, producer_id, producer_epoch)
        return pid, epoch

    async def init_transactional_sequence(self, broker_id: int, broker_epoch: int, transactional_id: str,
                                          transaction_timeout_ms: int, producer_id: int = -1,
                                          producer_epoch: int = -1, request_id: str = "") -> tuple[int, int, int]:
        """``init_transactional``, and the sequence of the id's last transaction (-1: none), which the
        producer's next transaction follows (``txn(..., sequence=)``).  ``request_id`` names this
        InitProducerId (unique per coordinator call): a copy of it applied again is answered as it was."""
        body = InitTransactionalProducerRequest(broker_id=broker_id, broker_epoch=broker_epoch,
                                                transactional_id=transactional_id,
                                                transaction_timeout_ms=transaction_timeout_ms,
                                                producer_id=producer_id, producer_epoch=producer_epoch,
                                                request_id=request_id)
        resp, _ = await self._call_any(body)
        return int(resp.producer_id), int(resp.producer_epoch), int(resp.txn_sequence)

    async def txn(self, broker_id: int, broker_epoch: int, op: str, transactional_id: str = "",
                  producer_id: int = -1, producer_epoch: int = -1, partitions: list | None = None,
                  start_time_ms: int = -1, sequence: int = -1) -> dict:
        """One step of a transaction, decided by the quorum (``TransactionRequest``): the transaction after it
        (the TransactionStateRecord's fields as a dict, partitions a list of [broker, topic, partition]).
        ``sequence`` names the transaction the step is for (-1: the id's current one); a retry of this
        call, or a copy of it delivered late, is refused for any other transaction."""
        body = TransactionRequest(broker_id=broker_id, broker_epoch=broker_epoch, op=op,
                                  transactional_id=transactional_id, producer_id=producer_id,
                                  producer_epoch=producer_epoch, partitions=json.dumps(partitions or []),
                                  start_time_ms=start_time_ms, sequence=sequence)
        resp, _ = await self._call_any(body)
        return json.loads(resp.transaction)

    async def pending_transactions(self, broker_id: int, limit: int = 100) -> list[dict]:
        """The transactions some coordinator must drive (prepared, or open past their timeout), as the
        answering node has applied them."""
        resp, _ = await self._call_any(TransactionRequest(broker_id=broker_id, broker_epoch=-1, op="pending",
                                                          limit=limit))
        return json.loads(resp.transactions)

    async def list_transactions(self, broker_id: int, after_transactional_id: str = "",
                                limit: int = 1000) -> list[dict]:
        """A page of every transactional id the quorum knows, in id order, after ``after_transactional_id``
        ('': from the first), each with its transaction as ``txn``'s dict (state Empty, no partitions, for an
        id with none open or ended since its producer was last initialized), as the answering node has
        applied them.  At most ``limit`` ids, fewer when their transactions are large; an empty page is
        the end.  The next page is after the last id of this one."""
        resp, _ = await self._call_any(TransactionRequest(broker_id=broker_id, broker_epoch=-1, op="list",
                                                          transactional_id=after_transactional_id,
                                                          limit=limit))
        return json.loads(resp.transactions)

    async def block_history(self, address: str, after: tuple[int, int, int] = (-1, -1, -1), limit: int = 1000,
                            broker_id: int | None = None) -> "BlockHistoryPage":
        """A page of the blocks in the audit trail of the node at ``address`` (no failover: the cursor is a
        place in that node's trail) after ``after``, the last page's ``BlockHistoryPage.cursor``."""
        body = BlockHistoryRequest(after_raft_index=after[0], after_position=after[1], cursor_offset=after[2],
                                   limit=limit, broker_id=-1 if broker_id is None else broker_id)
        resp = await self._conn(address).call(body, self.policy.attempt_timeout)
        if resp.error_code != 0:
            raise for_code(resp.error_code, f"{address}: {resp.error_message or Errors.of(resp.error_code).name}")
        try:
            blocks, gaps = json.loads(resp.blocks), json.loads(resp.gaps)
        except ValueError as e:
            raise ConnectionFailed(f"{address}: BlockHistory: unreadable answer: {e}") from None
        return BlockHistoryPage(address, int(resp.node_id), int(resp.applied_index), int(resp.trail_index), blocks,
                                [tuple(g) for g in gaps],
                                (int(resp.next_raft_index), int(resp.next_position), int(resp.next_offset)),
                                bool(resp.more))

    async def node_block_history(self, address: str, broker_id: int | None = None,
                                 page: int = 1000) -> "BlockHistoryPage":
        """Every block in the audit trail of the node at ``address`` (``block_history``, page after page),
        as one page: its ``trail_index`` and ``applied_index`` are the last page's."""
        out = await self.block_history(address, limit=page, broker_id=broker_id)
        last = out
        while last.more:
            last = await self.block_history(address, last.cursor, page, broker_id)
            out.blocks += last.blocks
            out.gaps += last.gaps
        return BlockHistoryPage(address, last.node_id, last.applied_index, last.trail_index, out.blocks, out.gaps,
                                last.cursor, False)

    async def block_history_each(self, addresses: Iterable[str] | None = None, broker_id: int | None = None,
                                 page: int = 1000) -> dict[str, "BlockHistoryPage | Exception"]:
        """``node_block_history`` of every node (default: this client's addresses) at once, by address, in
        the given order: its whole history, or the exception of a node that did not answer."""
        addresses = list(self.addresses if addresses is None else addresses)

        async def one(address: str) -> BlockHistoryPage | Exception:
            try:
                return await self.node_block_history(address, broker_id, page)
            except Exception as e:  # noqa: BLE001 - a node down or refusing: its error is its answer
                return e

        return dict(zip(addresses, await asyncio.gather(*(one(a) for a in addresses)), strict=True))

    async def describe_transactional(self, transactional_id: str) -> tuple[int, int]:
        """The transactional id's current (producer id, epoch), read through the leader; (-1, -1) if unknown."""
        resp, _ = await self._call_any(DescribeTransactionalIdRequest(transactional_id=transactional_id))
        return int(resp.producer_id), int(resp.producer_epoch)

    async def seed(self, next_producer_id: int, origin: str, zk_broker: int, zk_block_start: int,
                   zk_block_end: int) -> tuple[bool, int]:
        """Commit a migration seed (ZooKeeper's block_end + 1): (whether the cursor moved, next ID now)."""
        body = SeedProducerIdsRequest(next_producer_id=next_producer_id, origin=origin, zk_broker=zk_broker,
                                      zk_block_start=zk_block_start, zk_block_end=zk_block_end)
        resp, _ = await self._call_any(body)
        return bool(resp.changed), int(resp.next_producer_id)

    async def migrate(self, action: str, zk: str = "") -> dict:
        """``pidctl migrate bridge|finalize|rollback``: {mode, changed, next_producer_id, message}."""
        resp, _ = await self._call_any(MigrationCommandRequest(action=action, zk=zk))
        return {"mode": resp.mode, "changed": bool(resp.changed), "next_producer_id": int(resp.next_producer_id),
                "message": resp.message}

    async def alter_acl(self, action: str, acl: Any) -> bool:
        """``pidctl acl add|remove``: add or remove one ``quorum.security.acl.Acl``; whether anything changed."""
        resp, _ = await self._call_any(AlterAclsRequest(action=action, **acl.to_dict()))
        return bool(resp.changed)

    async def describe_acls(self, principal: str = "") -> tuple[list[Any], int]:
        """The ACL entries as some node has applied them, and that node's applied Raft index."""
        resp, _ = await self._call_any(DescribeAclsRequest(principal=principal))
        try:
            acls = [Acl.from_obj(a) for a in json.loads(resp.acls)]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ConnectionFailed(f"DescribeAcls: unreadable entry list: {e}") from None
        return acls, int(resp.applied_index)

    async def alter_client_quota(self, user: str | None, key: str, value: float = 0.0, remove: bool = False,
                                 validate_only: bool = False) -> bool:
        """Set (or remove) one quota key of ``user`` (None: the user default); whether it changed.
        Bad input raises InvalidRequestError with the reason."""
        body = AlterClientQuotaRequest(user=user, key=key, value=float(value), remove=remove,
                                       validate_only=validate_only)
        resp, _ = await self._call_any(body)
        return bool(resp.changed)

    async def describe_client_quotas(self) -> tuple[list[dict], str]:
        """Every user's quotas and the default ({"user": name | None, "values": {key: value}}), as the
        answering node has applied them, and that node's address (Kafka's DescribeClientQuotas)."""
        body = kafka.request_entity(api.DESCRIBE_CLIENT_QUOTAS, 1, components=(), strict=False)
        resp, node = await self._call_any(body)
        out = []
        for e in resp.entries or ():
            users = [d.entity_name for d in e.entity if d.entity_type == "user"]
            if len(users) == 1:
                out.append({"user": users[0], "values": {v.key: float(v.value) for v in e.values}})
        return out, node

    async def describe(self, address: str, action: str | None = None) -> dict:
        """DescribeState from one node (no failover: the caller asked for that node).
        ``action="snapshot"`` asks the node to write a snapshot now."""
        resp = await self._conn(address).call({"action": action} if action else {}, self.policy.attempt_timeout)
        if resp.get("error_code", 0) != 0:
            raise for_code(resp["error_code"], f"{address}: DescribeState failed")
        return resp

    async def describe_each(self, addresses: Iterable[str] | None = None) -> dict[str, dict | Exception]:
        """DescribeState of every node (default: this client's addresses) at once, by address, in the
        given order: the answer, or the exception of a node that did not answer."""
        addresses = list(self.addresses if addresses is None else addresses)

        async def one(address: str) -> dict | Exception:
            try:
                return await self.describe(address)
            except Exception as e:  # noqa: BLE001 - a dead or paused node: its error is its answer
                return e

        return dict(zip(addresses, await asyncio.gather(*(one(a) for a in addresses)), strict=True))

    async def probe(self, addresses: Iterable[str] | None = None) -> dict[str, Exception | None]:
        """ApiVersions to every node (default: this client's addresses) at once, each tried once, through
        this client's security (TLS handshake, SASL): None for a node that answered, else its error."""
        addresses = list(self.addresses if addresses is None else addresses)
        body = kafka.request_entity(kafka.API_VERSIONS, 0)

        async def one(address: str) -> Exception | None:
            try:
                resp = await self._conn(address).call(body, self.policy.attempt_timeout)
            except Exception as e:  # noqa: BLE001 - a node that cannot be reached: its error is its answer
                return e
            code = Errors.of(int(resp.error_code))
            return None if code == Errors.NONE else for_code(code, f"{address}: ApiVersions: {code.name}")

        return dict(zip(addresses, await asyncio.gather(*(one(a) for a in addresses)), strict=True))

    async def find_leader(self, timeout: float | None = None, *, addresses: Iterable[str] | None = None,
                          exclude: Collection[str] = (), poll: RetryPolicy = LEADER_POLL) -> tuple[str, dict]:
        """(client address, DescribeState) of the leader: asks every node (default: this client's
        addresses) and picks with ``quorum.client.leader.pick_leader``; a leader in ``exclude`` does not count.
        Asks again (``poll``'s delays) until ``timeout`` (None: the policy's timeout; 0: one round),
        then raises NotControllerError naming what each node said."""
        addresses = list(self.addresses if addresses is None else addresses)
        backoff = poll.start(self.policy.timeout if timeout is None else timeout)
        while True:
            answers = await self.describe_each(addresses)
            if all(isinstance(d, HandshakeFailed) for d in answers.values()):  # asking again cannot help
                raise QuorumUnreachableError(unreachable("no node answered", {a: str(d) for a, d in answers.items()}))
            leader = pick_leader({a: d for a, d in answers.items() if not isinstance(d, Exception)})
            if leader is not None and leader not in exclude:
                return leader, answers[leader]
            if not await backoff.sleep():
                other = f" other than {', '.join(exclude)}" if exclude else ""
                raise NotControllerError(f"no leader{other} among "
                                         + ", ".join(f"{a}: {summary(d)}" for a, d in answers.items()))

    async def take_snapshot(self, address: str, timeout: float) -> dict:
        """Ask one node to write a snapshot now (log compaction) and wait until its file is new: the
        node's snapshot description (path, bytes, mtime); RequestTimedOutError after ``timeout``."""
        before = (await self.describe(address))["snapshot"]
        await self.describe(address, action="snapshot")
        backoff = SNAPSHOT_POLL.start(timeout)
        while True:
            snap = (await self.describe(address))["snapshot"]
            if snap["bytes"] and snap["mtime_ns"] != before["mtime_ns"]:
                return snap
            if not await backoff.sleep():
                raise RequestTimedOutError(f"{address}: no new snapshot within {timeout:.0f}s")

    async def admin(self, address: str, body: dict, timeout: float) -> dict:
        """An admin action on one node (membership changes: ``quorum.membership``), with its own deadline."""
        resp = await self._conn(address).call(body, timeout)
        if resp.get("error_code", 0) != 0:
            raise for_code(resp["error_code"], f"{address}: {resp.get('error_message') or body.get('action')}")
        return resp

    async def close(self) -> None:
        if self._leader_task is not None and not self._leader_task.done():
            self._leader_task.cancel()
        for conn in self._conns.values():
            conn.close()
        await asyncio.sleep(0)


LEADER_RECHECK_S = 5.0  # a prefer_leader client looks for the leader again this often (a leader change)
SNAPSHOT_POLL = RetryPolicy(backoff_initial=0.05, backoff_max=0.05, jitter=0.0)  # a node's snapshot file, every 50 ms


def unreachable(what: str, errors: Mapping[str, str]) -> str:
    """One line for nodes that did not answer: ``what``, then each node's error (its text without the address
    it starts with), the nodes with the same error named together:
    ``no node answered: 10.0.0.1:9092, 10.0.0.2:9092: Connection refused; 10.0.0.3:9092: ...``."""
    by_reason: dict[str, list[str]] = {}
    for address, text in errors.items():
        reason = text[len(address) + 2:] if text.startswith(f"{address}: ") else text
        by_reason.setdefault(reason or "no answer", []).append(address)
    if not by_reason:
        return what
    return f"{what}: " + "; ".join(f"{', '.join(nodes)}: {reason}" for reason, nodes in by_reason.items())


def _throttle_ms(resp: Any) -> int:
    if isinstance(resp, dict):
        return int(resp.get("throttle_time_ms", 0))
    t = getattr(resp, "throttle_time", None)
    return int(t.total_seconds() * 1000) if t is not None else 0


__all__ = ["AllocatedBlock", "BlockHistoryPage", "Connection", "ConnectionFailed", "HandshakeFailed", "PidQuorumError", "QuorumClient",
           "QuorumUnreachableError", "RetryPolicy", "SettingNames", "unreachable"]
