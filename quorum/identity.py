"""Who a node is, and what its peers saw it hold: the guard against a node that forgot its log.

The ``identity`` file (cluster id, node uuid, start counter) and the ``peers`` file (per peer: its uuid,
last run, the highest log position it was seen to hold) give each peer's hello a verdict: refused (another
cluster, a replaced data directory), welcomed with a recovery target (a new run below what it was seen to
hold), or welcomed.  ``docs/durability.md`` ("Identity files and a peer's verdict", "A node that may have
lost what it acknowledged") has the rules and their limits.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass

from snapshots.storage.disk import (  # noqa: F401 - EXIT_IDENTITY_REFUSED is part of this API
    EXIT_IDENTITY_REFUSED,
    CorruptFileError,
    Disk,
)
from snapshots.storage.files import seal, unseal

log = logging.getLogger(__name__)

IDENTITY_FILE = "identity"
PEERS_FILE = "peers"
IDENTITY_MAGIC = b"PQIDNT\x00\x01"
PEERS_MAGIC = b"PQPEER\x00\x01"
RAFT_FILES = ("raft.journal", "raft.journal.meta", "raft.snapshot")
HELLO_PROTO = 2  # 2: hellos carry the log end and are answered with a verdict (pq_welcome / pq_refused)

Position = tuple[int, int]


class IdentityError(Exception):
    """This node must not start with this data directory (the message says why and what to do)."""


def derived_cluster_id(secret: str) -> str:
    """The default cluster id of a cluster with no ``cluster_id`` configured: the same on every
    node that shares the secret, and nothing of the secret can be read back from it."""
    return "s-" + hashlib.sha256(b"pidquorum cluster id\0" + secret.encode()).hexdigest()[:20]


def new_cluster_id() -> str:
    return "c-" + uuid.uuid4().hex


def _parse_position(value, what: str) -> Position | None:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)):
        raise ValueError(f"{what} is {value!r}, not [term, index]")
    return (int(value[0]), int(value[1]))


@dataclass(frozen=True)
class Hello:
    cluster_id: str
    node_uuid: str
    generation: int
    run: str
    client_address: str | None = None
    log_end: Position | None = None   # the sender's durable log end (term, index)
    proto: int = HELLO_PROTO

    def message(self, log_end: Position | None = None) -> dict:
        end = log_end if log_end is not None else self.log_end
        return {"type": "pq_hello", "cluster": self.cluster_id, "node": self.node_uuid, "gen": self.generation,
                "run": self.run, "client": self.client_address, "log": list(end) if end else None,
                "proto": self.proto}

    @classmethod
    def from_message(cls, m: dict) -> "Hello":
        gen = m.get("gen")
        if isinstance(gen, bool) or not isinstance(gen, int) or gen < 1:
            raise ValueError(f"bad generation {gen!r}")
        for key in ("cluster", "node", "run"):
            if not isinstance(m.get(key), str) or not m[key]:
                raise ValueError(f"bad {key} {m.get(key)!r}")
        proto = m.get("proto", 1)
        if isinstance(proto, bool) or not isinstance(proto, int) or proto < 1:
            raise ValueError(f"bad proto {proto!r}")
        client = m.get("client")
        return cls(m["cluster"], m["node"], gen, m["run"], client if isinstance(client, str) else None,
                   _parse_position(m.get("log"), "log"), proto)


@dataclass(frozen=True)
class Verdict:
    """What this node decided about a peer's hello."""

    refused: str | None = None          # why the peer may not talk Raft with us (it must stop)
    recover: Position | None = None     # the peer lost entries: it must reach this position first
    new_run: bool = False               # the peer restarted since we last saw it (or is new to us)


class NodeIdentity:
    """This node's identity and its durable knowledge of peers."""

    def __init__(self, data_dir: str, hello: Hello, peers: dict[str, dict], disk: Disk, existed: bool):
        self.data_dir = data_dir
        self.hello = hello
        self.disk = disk
        self.existed = existed  # the identity file was there before this start
        self._peers = peers
        self._peers_path = os.path.join(data_dir, PEERS_FILE)
        self._dirty = False

    @property
    def cluster_id(self) -> str:
        return self.hello.cluster_id

    @classmethod
    def open(cls, data_dir: str, secret: str, configured_cluster_id: str | None = None,
             client_address: str | None = None, disk: Disk | None = None,
             new_id=lambda: uuid.uuid4().hex) -> "NodeIdentity":
        """``new_id()`` draws the uuid of a new data directory and each run's id (the simulator passes
        a seeded one)."""
        disk = disk or Disk()
        disk.make_dir(data_dir)
        path = os.path.join(data_dir, IDENTITY_FILE)
        data = disk.read(path)
        if data is not None:
            body = unseal(path, data, IDENTITY_MAGIC, "identity file")
            try:
                cluster_id, node_uuid, generation = str(body["cluster_id"]), str(body["node_uuid"]), body["generation"]
            except KeyError as e:
                raise CorruptFileError(path, f"missing {e.args[0]}") from None
            if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
                raise CorruptFileError(path, f"generation is {generation!r}")
            if configured_cluster_id and configured_cluster_id != cluster_id:
                raise IdentityError(
                    f"data directory {data_dir} belongs to cluster {cluster_id}, but the config says cluster_id = "
                    f"{configured_cluster_id!r}: a node never joins another cluster with its data; give it an "
                    f"empty data directory and add it with 'pidctl quorum add-node'")
            generation += 1
            created = body.get("created_ms", 0)
        else:
            legacy = [f for f in RAFT_FILES if disk.exists(os.path.join(data_dir, f))]
            cluster_id = configured_cluster_id or derived_cluster_id(secret)
            node_uuid, generation, created = new_id(), 1, int(time.time() * 1000)
            if legacy:
                log.warning("data directory %s has Raft state (%s) but no identity file (written by an earlier "
                            "version): creating identity node %s in cluster %s%s", data_dir, ", ".join(legacy),
                            node_uuid, cluster_id,
                            "" if configured_cluster_id else " (derived from the cluster secret; set cluster_id "
                                                             "in the config to fix it)")
            else:
                log.info("new data directory %s: node %s in cluster %s", data_dir, node_uuid, cluster_id)
        disk.write_file(path, seal(IDENTITY_MAGIC, {"cluster_id": cluster_id, "node_uuid": node_uuid,
                                                    "generation": generation, "created_ms": created}))
        peers = cls._load_peers(disk, os.path.join(data_dir, PEERS_FILE))
        hello = Hello(cluster_id, node_uuid, generation, new_id()[:16], client_address)
        log.info("node identity: cluster %s, node %s, start %d", cluster_id, node_uuid, generation)
        return cls(data_dir, hello, peers, disk, existed=data is not None)

    @staticmethod
    def _load_peers(disk: Disk, path: str) -> dict[str, dict]:
        data = disk.read(path)
        if data is None:
            return {}
        body = unseal(path, data, PEERS_MAGIC, "peers file")
        peers = body.get("peers", {})
        if not isinstance(peers, dict):
            raise CorruptFileError(path, "peers is not a map")
        out = {}
        for address, known in peers.items():
            if not isinstance(address, str) or not isinstance(known, dict) or not isinstance(known.get("node"), str):
                raise CorruptFileError(path, f"bad entry for {address!r}: {known!r}")
            try:
                held = _parse_position(known.get("held"), "held")
            except ValueError as e:
                raise CorruptFileError(path, f"{address}: {e}") from None
            out[address] = {"node": known["node"], "run": known.get("run"), "gen": known.get("gen"), "held": held}
        return out

    def _store_peers(self) -> None:
        self.disk.write_file(self._peers_path, seal(PEERS_MAGIC, {"peers": self._peers}))
        self._dirty = False

    def flush(self) -> None:
        """Write what was learned since the last write (called at most once a second, and at shutdown)."""
        if self._dirty:
            self._store_peers()

    # ---------------------------------------------------------------- checks
    def admit(self, address: str, hello: Hello, record: bool = True) -> Verdict:
        """Decide about the peer at ``address`` (what we learned is stored durably first when it matters;
        with ``record`` false, for a peer outside the configuration, nothing is stored)."""
        if hello.cluster_id != self.cluster_id:
            return Verdict(refused=f"{address} belongs to cluster {hello.cluster_id}, this is cluster "
                                   f"{self.cluster_id}: a node of another cluster (check its config's peers and "
                                   f"cluster_id)")
        known = self._peers.get(address)
        if known is not None and hello.node_uuid != known["node"]:
            return Verdict(refused=(
                f"{address} presents node identity {hello.node_uuid}, but this cluster knows {address} as node "
                f"{known['node']}: its data directory was lost or replaced, and a node that lost its log must "
                f"never rejoin as the same member (it could drop committed entries and re-issue producer IDs). "
                f"Replace it: 'pidctl quorum remove-node {address}' on the cluster, then start a fresh node with "
                f"an empty data directory and 'pidctl quorum add-node' it (docs/operations.md)"))
        new_run = known is None or known.get("run") != hello.run
        held = known.get("held") if known else None
        recover = None
        if new_run and held is not None and (hello.log_end is None or hello.log_end < held):
            recover = held
        if not record:
            return Verdict(recover=recover, new_run=new_run)
        entry = {"node": hello.node_uuid, "run": hello.run, "gen": hello.generation,
                 "held": _max_position(held, hello.log_end)}
        self._peers[address] = entry
        if new_run:
            self._store_peers()  # a restart is rare: remember it at once
        elif entry["held"] != held:
            self._dirty = True
        return Verdict(recover=recover, new_run=new_run)

    def note_held(self, address: str, position: Position) -> None:
        """``address`` showed it holds ``position`` durably (a ping, or an acknowledgement to this leader)."""
        known = self._peers.get(address)
        if known is None:
            return
        top = _max_position(known.get("held"), position)
        if top != known.get("held"):
            known["held"] = top
            self._dirty = True

    def held(self, address: str) -> Position | None:
        known = self._peers.get(address)
        return known.get("held") if known else None

    def forget(self, address: str) -> None:
        """``address`` was removed from the cluster: a fresh node may be added there later."""
        if self._peers.pop(address, None) is not None:
            self._store_peers()
            log.info("forgot the identity of %s (removed from the cluster)", address)

    def known_peers(self) -> dict[str, dict]:
        return {a: dict(v) for a, v in self._peers.items()}

    def describe(self) -> dict:
        h = self.hello
        return {"cluster_id": h.cluster_id, "node_uuid": h.node_uuid, "generation": h.generation, "run": h.run}


def _max_position(a: Position | None, b: Position | None) -> Position | None:
    if a is None:
        return tuple(b) if b is not None else None
    if b is None:
        return tuple(a)
    return tuple(max(tuple(a), tuple(b)))
