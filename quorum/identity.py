"""Who a node is, and who its peers were: the guard against a node that forgot its log.

A Raft member that acknowledged entries and then lost them (its data directory
wiped, or an old backup restored) must never take part again under its old
name: the entries it acknowledged may exist on no other live node, so an
election it votes in can drop committed entries, and the quorum would then
issue those producer IDs a second time.

Two small files in the data directory say who the node is and what it knows:

``identity``
    ``cluster_id`` (fixed when the cluster was bootstrapped), ``node_uuid``
    (fixed when this data directory was created) and ``generation``, raised by
    one, durably, on every start.  Each process also draws a random ``run``.
``peers``
    for each peer's Raft address, the (``node_uuid``, ``generation``, ``run``)
    it last presented.

Every Raft connection starts with a hello carrying the sender's identity (see
``quorum.raft``); no other message of that connection reaches Raft before the
receiver has checked it against ``peers`` and stored what it learned.  Refused:

* another ``cluster_id``: a node of another cluster;
* another ``node_uuid`` for a known address: the node's data directory was
  lost or replaced (an empty data directory gets a new uuid);
* a lower ``generation``, or the same generation with another ``run``: an old
  copy of the data directory (a restored backup) started again.

The refused node is told why, logs it with what to do, and exits
(``EXIT_IDENTITY_REFUSED``).  The check needs one peer that saw the later run;
``docs/deployment.md`` explains the limit.

Data directories from versions before this file existed get an identity on
their first start (with a log line); the cluster id then defaults to one
derived from the cluster secret, the same on every node of the cluster.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass

from .errors import CorruptFileError
from .fsutil import atomic_write, seal, unseal

log = logging.getLogger(__name__)

IDENTITY_FILE = "identity"
PEERS_FILE = "peers"
IDENTITY_MAGIC = b"PQIDNT\x00\x01"
PEERS_MAGIC = b"PQPEER\x00\x01"
EXIT_IDENTITY_REFUSED = 78  # EX_CONFIG: systemd must not restart it (deploy/pidquorum-node@.service)
RAFT_FILES = ("raft.journal", "raft.snapshot")


class IdentityError(Exception):
    """This node must not start with this data directory (the message says why and what to do)."""


def derived_cluster_id(secret: str) -> str:
    """The default cluster id of a cluster with no ``cluster_id`` configured: the same on every
    node that shares the secret, and nothing of the secret can be read back from it."""
    return "s-" + hashlib.sha256(b"pidquorum cluster id\0" + secret.encode()).hexdigest()[:20]


def new_cluster_id() -> str:
    return "c-" + uuid.uuid4().hex


@dataclass(frozen=True)
class Hello:
    cluster_id: str
    node_uuid: str
    generation: int
    run: str
    client_address: str | None = None

    def message(self) -> dict:
        return {"type": "pq_hello", "cluster": self.cluster_id, "node": self.node_uuid, "gen": self.generation,
                "run": self.run, "client": self.client_address}

    @classmethod
    def from_message(cls, m: dict) -> "Hello":
        gen = m.get("gen")
        if isinstance(gen, bool) or not isinstance(gen, int) or gen < 1:
            raise ValueError(f"bad generation {gen!r}")
        for key in ("cluster", "node", "run"):
            if not isinstance(m.get(key), str) or not m[key]:
                raise ValueError(f"bad {key} {m.get(key)!r}")
        client = m.get("client")
        return cls(m["cluster"], m["node"], gen, m["run"], client if isinstance(client, str) else None)


class NodeIdentity:
    """This node's identity (raised a generation by ``open``) and its durable knowledge of peers."""

    def __init__(self, data_dir: str, hello: Hello, peers: dict[str, dict]):
        self.data_dir = data_dir
        self.hello = hello
        self._peers = peers
        self._peers_path = os.path.join(data_dir, PEERS_FILE)

    @property
    def cluster_id(self) -> str:
        return self.hello.cluster_id

    @classmethod
    def open(cls, data_dir: str, secret: str, configured_cluster_id: str | None = None,
             client_address: str | None = None) -> "NodeIdentity":
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, IDENTITY_FILE)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
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
            legacy = [f for f in RAFT_FILES if os.path.exists(os.path.join(data_dir, f))]
            cluster_id = configured_cluster_id or derived_cluster_id(secret)
            node_uuid, generation, created = uuid.uuid4().hex, 1, int(time.time() * 1000)
            if legacy:
                log.warning("data directory %s has Raft state (%s) but no identity file (written by an earlier "
                            "version): creating identity node %s in cluster %s%s", data_dir, ", ".join(legacy),
                            node_uuid, cluster_id,
                            "" if configured_cluster_id else " (derived from the cluster secret; set cluster_id "
                                                             "in the config to fix it)")
            else:
                log.info("new data directory %s: node %s in cluster %s", data_dir, node_uuid, cluster_id)
        # Durable before any peer can see this generation: a later start must present a higher one.
        atomic_write(path, seal(IDENTITY_MAGIC, {"cluster_id": cluster_id, "node_uuid": node_uuid,
                                                 "generation": generation, "created_ms": created}))
        peers = cls._load_peers(os.path.join(data_dir, PEERS_FILE))
        hello = Hello(cluster_id, node_uuid, generation, uuid.uuid4().hex[:16], client_address)
        log.info("node identity: cluster %s, node %s, generation %d", cluster_id, node_uuid, generation)
        return cls(data_dir, hello, peers)

    @staticmethod
    def _load_peers(path: str) -> dict[str, dict]:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        body = unseal(path, data, PEERS_MAGIC, "peers file")
        peers = body.get("peers", {})
        if not isinstance(peers, dict):
            raise CorruptFileError(path, "peers is not a map")
        return peers

    def _store_peers(self) -> None:
        atomic_write(self._peers_path, seal(PEERS_MAGIC, {"peers": self._peers}))

    # ---------------------------------------------------------------- checks
    def check(self, address: str, hello: Hello) -> str | None:
        """None if the peer at ``address`` may talk Raft with us (what we learned is stored first),
        else the reason it may not."""
        if hello.cluster_id != self.cluster_id:
            return (f"{address} belongs to cluster {hello.cluster_id}, this is cluster {self.cluster_id}: "
                    f"a node of another cluster (check its config's peers and cluster_id)")
        known = self._peers.get(address)
        if known is not None:
            if hello.node_uuid != known["node"]:
                return (f"{address} presents node identity {hello.node_uuid}, but this cluster knows {address} as "
                        f"node {known['node']} (generation {known['gen']}): its data directory was lost or "
                        f"replaced, and a node that lost its log must never rejoin as the same member (it could "
                        f"drop committed entries and re-issue producer IDs). Replace it: 'pidctl quorum "
                        f"remove-node {address}' on the cluster, then start a fresh node with an empty data "
                        f"directory and 'pidctl quorum add-node' it (docs/operations.md)")
            if hello.generation < known["gen"] or (hello.generation == known["gen"] and hello.run != known["run"]):
                return (f"{address} (node {hello.node_uuid}) presents generation {hello.generation}, but it "
                        f"already ran as generation {known['gen']}: this is an older copy of its data directory "
                        f"(a restored backup?) that may lack entries it acknowledged. Never restart a node from "
                        f"an old backup; replace it: 'pidctl quorum remove-node {address}', then add a fresh node "
                        f"(docs/deployment.md, backup and restore)")
            if hello.generation == known["gen"]:
                return None  # the same run, reconnecting
        self._peers[address] = {"node": hello.node_uuid, "gen": hello.generation, "run": hello.run}
        self._store_peers()
        return None

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
