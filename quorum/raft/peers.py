"""The identity checks a ``RaftNode`` runs on its links: its hello, its verdict on a peer's hello (welcome
or refusal, with the peer's word for its start), the peer's verdict on it, and the pings that keep what
each peer holds known (``quorum.identity``).  Mixed into ``RaftNode``, whose state it shares (``node``);
the gate (``gate.Gate``) hands them the messages."""
from __future__ import annotations

import logging
from typing import Any

from snapshots.storage.disk import EXIT_IDENTITY_REFUSED

from .. import linkcrypto
from ..identity import Hello, NodeIdentity, Verdict
from .files import fmt_position
from .fields import is_int
from .upstream import clock as raft_clock

log = logging.getLogger(__package__ + ".node")  # the node's log lines keep their logger's name

MAX_MEMBERS = 64  # the most members a configuration in a peer's vouch may name


class PeerChecks:
    """A peer's checks: ``_verified`` (its hello admitted, or why it was refused), ``_welcomed`` (its verdict
    on this node arrived); Raft traffic of a peer that has not passed both is dropped (``_admitted``).
    ``RaftNode.__init__`` sets the state below."""

    self_addr: str
    journal: Any
    identity: NodeIdentity
    link_master: bytes | None
    failstop: Any
    unverified_dropped: int
    peer_clients: dict[str, str]
    _obj: Any  # the Raft object (``replication.Replicated``)
    _transport: Any
    _transport_holder: list
    _verified: dict[str, bool | str]
    _welcomed: dict[str, bool]
    _pre_vote_peers: dict[str, bool]
    _nudged: dict[str, float]
    _outside: dict[str, tuple]
    _refusal_logged: dict[str, float]
    _vouchers: dict
    _voucher_configs: dict
    _unknown_ends: set[str]
    _peers_vouched: bool

    def hello_message(self) -> dict:
        message = self.identity.hello.message(self.journal.durable_end())
        if self.link_master is not None and linkcrypto.OFFERED:
            message["codecs"] = list(linkcrypto.OFFERED)  # an earlier version ignores the field
        message["pre_vote"] = True  # this node answers pq_pre_vote (an earlier version ignores the field)
        return message

    def votes_without_pre_vote(self, address: str) -> bool:
        """``address``'s hello came, without ``pre_vote``: a node of an earlier version, which never answers a
        pre-vote and votes as it always did (``Replicated._election_due`` counts it as granted)."""
        return self._pre_vote_peers.get(address) is False

    def _reset_peer_checks(self, node) -> None:
        """A connection to ``node`` was (re)established or lost: its checks start again."""
        self._verified.pop(node.address, None)
        self._welcomed.pop(node.address, None)
        self._outside.pop(node.address, None)

    def _admitted(self, address: str) -> bool:
        return self._verified.get(address) is True and self._welcomed.get(address, False)

    def _not_admitted(self, node) -> None:
        """Raft traffic before both checks passed is dropped; ask for what is missing, twice a second at most."""
        self.unverified_dropped += 1
        address = node.address
        if isinstance(self._verified.get(address), str):
            return  # refused
        now = raft_clock()
        if now - self._nudged.get(address, float("-inf")) < 0.5:
            return
        self._nudged[address] = now
        if address not in self._verified:
            self._transport.send_unsynced(node, {"type": "pq_hello_request"})
        else:
            self._transport.send_unsynced(node, self.hello_message())  # answered with its verdict

    def _on_hello(self, node, message) -> None:
        """A peer's hello (in a tick): our verdict on it, sent back to it."""
        address = node.address
        # A peer outside this node's configuration (its log lacks the entry that added it, or it was removed)
        # is checked alike, but what it presents is recorded only once it is a member (``became_member``):
        # a node removed and still running must not make a fresh node added later at its address look like a
        # lost data directory.
        member = any(n.address == address for n in self._obj.other_nodes)
        try:
            hello = Hello.from_message(message)
            verdict = self.identity.admit(address, hello, record=member)
        except ValueError as e:
            hello, verdict = None, Verdict(refused=f"malformed hello from {address}: {e}")
        if verdict.refused is not None:
            self._refuse(node, verdict.refused)
            return
        self._verified[address] = True
        if member:
            self._outside.pop(address, None)
        else:
            self._outside[address] = (node, hello)
        if hello.proto < 2:
            self._welcomed[address] = True  # an older version sends no verdict
        if hello.client_address:
            self.peer_clients[address] = hello.client_address
        self._pre_vote_peers[address] = message.get("pre_vote") is True
        if verdict.new_run:
            self._obj.forget_match(node)
        if verdict.recover is not None:
            log.warning("%s started with its log at %s, below %s it was seen to hold: it must catch up before it "
                        "votes or counts toward a majority", address, fmt_position(hello.log_end), fmt_position(verdict.recover))
        held = self.identity.held(address)
        self._transport_holder[0].send_unsynced(node, {
            "type": "pq_welcome", "by": self.self_addr,
            "recover": list(verdict.recover) if verdict.recover is not None else None,
            "vouch": {"log_end": list(self.journal.durable_end()), "held": list(held) if held else None,
                      "term": self._obj.current_term(),
                      "config": self._config_word()}})

    def _config_word(self) -> dict:
        """This node's configuration as its word carries it: members, the log index of the entry that made
        it, and whether that entry is committed here (``_configurations``)."""
        at = self._obj.config_index()
        return {"members": self.members(), "index": at, "committed": self._obj.commit_index >= at}

    def _refuse(self, node, reason: str) -> None:
        address = node.address
        self._verified[address] = reason
        self._outside.pop(address, None)
        now = raft_clock()
        if now - self._refusal_logged.get(address, float("-inf")) >= 10.0:
            self._refusal_logged[address] = now
            log.error("refusing Raft traffic from %s: %s", address, reason)
        self._transport_holder[0].send_unsynced(node, {"type": "pq_refused", "reason": reason, "by": self.self_addr})

    def became_member(self, node) -> None:
        """A membership entry made ``node`` a member while its link was up as an outside peer's: what its
        hello presented is recorded now, as a member's is at its hello (and refused as there)."""
        outside = self._outside.pop(node.address, None)
        if outside is None:
            return
        verdict = self.identity.admit(node.address, outside[1])
        if verdict.refused is not None:
            self._refuse(outside[0], verdict.refused)

    def _on_welcome(self, node, message) -> None:
        """A peer's verdict on this node: welcomed, perhaps with a position this node must reach first,
        and its word for this start (its log end, what it saw this node hold, its term)."""
        vouch = message.get("vouch")
        if isinstance(vouch, dict) and not self._peers_vouched:
            ends = [vouch.get("log_end"), vouch.get("held")]
            term = vouch.get("term")
            if is_int(term) and term >= 0 and all(e is None or (isinstance(e, (list, tuple)) and len(e) == 2 and all(
                    is_int(x) and x >= 0 for x in e)) for e in ends):
                # Its log end, not what it saw this node hold: see check_vouched.
                self._vouchers[node.address] = (tuple(ends[0]) if ends[0] is not None else None, term)
                if ends[0] is None:
                    self._unknown_ends.add(node.address)
                config = vouch.get("config")  # an earlier version sends none
                if (isinstance(config, dict) and is_int(config.get("index")) and config["index"] >= 0
                        and isinstance(config.get("members"), list) and 0 < len(config["members"]) <= MAX_MEMBERS
                        and all(isinstance(a, str) and 0 < len(a) <= 300 for a in config["members"])):
                    self._voucher_configs[node.address] = (frozenset(config["members"]), config["index"],
                                                           config.get("committed") is True)
                elif config is not None:
                    log.warning("ignoring a malformed configuration in the vouch of %s: %r", node.address,
                                str(config)[:200])
            else:
                log.warning("ignoring a malformed vouch from %s: %r", node.address, vouch)
        elif vouch is None and not self._peers_vouched:
            self._vouchers[node.address] = (None, 0)  # an older version's verdict: its recover target below
            self._unknown_ends.add(node.address)
        target = message.get("recover")
        if target is not None and self._peers_vouched:
            log.info("%s saw this node hold %r in an earlier run; the peers that vouched for this start set its "
                     "target already", node.address, target)
        elif target is not None:
            if not (isinstance(target, (list, tuple)) and len(target) == 2 and all(is_int(x) and x >= 0
                                                                                     for x in target)):
                log.warning("ignoring a malformed verdict from %s: recover=%r", node.address, target)
                return
            self.adopt_target(tuple(target), f"{node.address} saw this node hold {fmt_position(tuple(target))}")
        self._welcomed[node.address] = True
        self.check_vouched()

    def _on_refused(self, node, message) -> None:
        """A peer refused this node's identity: never take part in Raft as this member; stop."""
        reason = message.get("reason") if isinstance(message, dict) else None
        self.failstop(EXIT_IDENTITY_REFUSED, f"refusing to start: peer {node.address} refused this node "
                                             f"({self.self_addr}): "
                                             f"{reason if isinstance(reason, str) else 'no reason given'}")

    def _on_ping(self, node, message) -> None:
        pos = message.get("log")
        if isinstance(pos, (list, tuple)) and len(pos) == 2 and all(is_int(x) and x >= 0 for x in pos):
            self.identity.note_held(node.address, (pos[0], pos[1]))

    def peer_client_address(self, raft_address: str) -> str | None:
        return self.peer_clients.get(raft_address)
