"""The gate every Raft message passes: durability before a message leaves, identity before one is read,
and the link's encoding (``quorum.linkcrypto``: AES-GCM per connection once both ends offer it)."""
from __future__ import annotations

import logging
from typing import Any, Protocol

from .. import linkcrypto
from ..linkcrypto import AEAD1, LinkCodec


class GateOwner(Protocol):
    """What the gate uses of its node (``quorum.raft.node.RaftNode``): the journal it syncs, the link key,
    the identity checks it hands a peer's hellos and verdicts to."""
    journal: Any
    identity: Any
    link_master: bytes | None
    messages_read: int
    peer_clients: dict[str, str]

    def hello_message(self) -> dict: ...

    def became_member(self, node: Any) -> None: ...

    def _reset_peer_checks(self, node: Any) -> None: ...

    def _admitted(self, address: str) -> bool: ...

    def _not_admitted(self, node: Any) -> None: ...

    def _on_hello(self, node: Any, message: Any) -> None: ...

    def _on_welcome(self, node: Any, message: Any) -> None: ...

    def _on_refused(self, node: Any, message: Any) -> None: ...

    def _on_ping(self, node: Any, message: Any) -> None: ...


log = logging.getLogger(__name__)


class Gate:
    """Mixed into the node's transport (``TcpTransport`` in a node process; the simulator's
    ``upstream.MessageTransport``).

    It makes the journal durable before any message leaves, except the leader's AppendEntries.
    A follower's acknowledgement, a vote, anything that reflects this node's log or term, waits for
    the fdatasync.  The leader's AppendEntries go out first and the leader begins its sync right after
    (the tick callback, ``DurableJournal.start_sync``: the fdatasync runs on the node's sync thread
    while the node reads acknowledgements), so it runs while the followers do theirs: one disk
    sync on the critical path instead of two (Raft thesis 10.2.1).  Safe because the leader's own copy
    only matters for commit, and pysyncobj records a new commit index through
    ``DurableJournal.setRaftCommitIndex``, which first collects that sync (or syncs): nothing is
    applied, answered or announced as committed before the leader's copy is durable.

    It also lets no message of a connection reach Raft before the peer's identity hello was checked
    and the peer's verdict on this node arrived (``quorum.identity``).
    """

    owner: GateOwner

    def send(self, node, message):
        if not (isinstance(message, dict) and message.get("type") == "append_entries"):
            self.owner.journal.sync()
        return super().send(node, message)

    def send_unsynced(self, node, message):
        """Identity-gate messages: they carry only the durable log end, never anything unsynced."""
        return super().send(node, message)

    def node_connected(self, node):
        self.owner._reset_peer_checks(node)
        self._install_codec(node)
        # First on the connection, so it arrives before anything pysyncobj sends on it.
        super().send(node, self.owner.hello_message())
        super().node_connected(node)

    # ---------------------------------------- the link's encoding (quorum.linkcrypto)
    def _link(self, node) -> LinkCodec | None:
        codec = getattr(self.connection(node), "encryptor", None)
        return codec if isinstance(codec, LinkCodec) else None

    def _install_codec(self, node) -> None:
        """A new handshake on ``node``'s connection: its messages stay under Fernet until a direction switches."""
        master, fernet = self.owner.link_master, self.syncobj and self.syncobj.encryptor
        conn = self.connection(node)
        if master is not None and fernet is not None and conn is not None and conn.encryptor is not None:
            conn.encryptor = LinkCodec(fernet, master, conn)

    def _seal_if_offered(self, node, offered) -> None:
        """The peer's hello lists what it reads: tell it, under Fernet, that what follows is sealed with AES-GCM."""
        codec = self._link(node)
        if (codec is None or codec.sealing or AEAD1 not in linkcrypto.OFFERED
                or not isinstance(offered, list) or AEAD1 not in offered):
            return
        if super().send(node, {"type": "pq_codec", "codec": AEAD1}):
            codec.seal_from_now()

    def _peer_sealing(self, node, message) -> None:
        codec, name = self._link(node), message.get("codec")
        if codec is not None and name == AEAD1 and AEAD1 in linkcrypto.OFFERED:
            codec.open_from_now()
            return
        # Nothing after this message could be read: start the connection again.
        log.error("%s seals its messages with %r, which this node did not offer: reconnecting", node.address, name)
        conn = self.connection(node)
        if conn is not None:
            conn.disconnect()

    def node_disconnected(self, node):
        self.owner._reset_peer_checks(node)
        super().node_disconnected(node)

    def message_received(self, node, message):
        kind = message.get("type") if isinstance(message, dict) else None
        owner = self.owner
        owner.messages_read += 1
        if kind == "pq_hello":
            owner._on_hello(node, message)
            self._seal_if_offered(node, message.get("codecs"))
        elif kind == "pq_codec":
            self._peer_sealing(node, message)  # the link's encoding, whatever the checks: nothing else is read
        elif kind == "pq_welcome":
            owner._on_welcome(node, message)
        elif kind == "pq_refused":
            owner._on_refused(node, message)
        elif kind == "pq_hello_request":
            super().send(node, owner.hello_message())
        elif not owner._admitted(node.address):
            owner._not_admitted(node)
        elif kind == "pq_ping":
            owner._on_ping(node, message)
        else:
            super().message_received(node, message)

    def destroy(self):
        # pysyncobj's destroy() drops every node: that is a shutdown, not a membership change, and the
        # identities this node learnt must survive it (else a wiped or restored peer is accepted after
        # a restart of this node).
        self._destroying = True
        super().destroy()

    def addNode(self, node):
        super().addNode(node)
        # A membership entry made ``node`` a member, perhaps while its link was up as an outside peer's.
        self.owner.became_member(node)

    def dropNode(self, node):
        # A membership change removed ``node``: a fresh node may later be added at its address.
        if getattr(self, "_destroying", False):
            self.owner.peer_clients.pop(node.address, None)
            super().dropNode(node)
            return
        self.owner.identity.forget(node.address)
        self.owner.peer_clients.pop(node.address, None)
        # The link stays: the change may be an uncommitted entry that the leader (perhaps ``node`` itself)
        # will cut, and Raft servers take a leader's AppendEntries from outside their configuration.  Raft
        # counts only members: ``Replicated`` takes nothing else from it (no vote, request or ack).

