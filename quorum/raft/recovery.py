"""The recovery gate of a ``RaftNode``: a node that may have lost entries it acknowledged, or whose start
the peers have not vouched for yet, neither votes, nor stands for election, nor counts toward a majority
until its durable log reaches its target.  Mixed into ``RaftNode``, whose state it shares (``node``);
``docs/durability.md`` has the reasoning."""
from __future__ import annotations

import logging
from typing import Any

from ..journal import Position
from .files import fmt_position

log = logging.getLogger(__package__ + ".node")  # the node's log lines keep their logger's name


class RecoveryGate:
    """Who may count: the recovery target (``adopt_target``, ``check_recovery``) and the peers' word for
    this start (``check_vouched``).  ``RaftNode.__init__`` sets the state below; the peers' word arrives
    with their verdicts (``peers.PeerChecks._on_welcome``)."""

    self_addr: str
    journal: Any
    recovery: Position | None
    recovery_reason: str | None
    vouched: bool
    _obj: Any  # the Raft object (``replication.Replicated``)
    _vouchers: dict[str, tuple[Position | None, int]]
    _voucher_configs: dict[str, tuple[frozenset, int, bool]]
    _unknown_ends: set[str]
    _peers_vouched: bool
    _verified: dict[str, bool | str]
    _welcomed: dict[str, bool]

    def adopt_target(self, target: Position, reason: str) -> None:
        """This node may have lost entries it acknowledged, up to ``target``: record that durably, then
        stop voting, standing and counting until the durable log reaches it."""
        target = (int(target[0]), int(target[1]))
        current = self.recovery
        new = max(current, target) if current is not None else target
        if self.journal.durable_end() >= new:
            return
        if new != current:
            self.journal.set_recovery_target(new)  # durable before this node acts on anything else
            self.recovery, self.recovery_reason = new, reason
            log.warning("this node may have lost entries it acknowledged (%s): it will not vote, stand for "
                        "election or count toward a majority until its log reaches %s (now %s)", reason,
                        fmt_position(new), fmt_position(self.journal.durable_end()))
        obj = getattr(self, "_obj", None)
        if obj is not None:
            obj.step_down()

    @property
    def restricted(self) -> bool:
        """Neither votes (but see _may_vote), nor stands for election, nor counts toward a majority."""
        return self.recovery is not None or not self.vouched

    @staticmethod
    def _needed(members: set) -> int:
        """Of a configuration of ``members`` (this node among them), the others whose word meets every
        majority this node could have been part of without itself: n - majority + 1 of the n - 1 others
        (both in three nodes, three of four in five)."""
        n = len(members)
        return min(n - (n // 2 + 1) + 1, n - 1)

    def vouchers_needed(self) -> int:
        """Peers whose word a restarted node needs in its own configuration (``_needed``)."""
        return self._needed({self.self_addr, *(n.address for n in self._obj.other_nodes)})

    def _configurations(self) -> list[set]:
        """The configurations whose majorities this start's word must meet: this node's own, and every newer
        one a peer that gave its word reported with this node in it.  A start on a copy from before a
        membership change knows only the configuration of its time; the changes since may have made
        majorities that hold none of its own peers (two members add a third: the new one and this node were
        a majority without the other), and the entries they committed are on none of its own peers' logs.

        A peer whose configuration's entry is committed on it holds every committed entry below that entry
        (Raft's log matching): its word stands for every older configuration, this node's own included, which
        then asks for no more words (a copy from before a replacement does not wait for the member replaced,
        which never comes back)."""
        own = frozenset({self.self_addr, *(n.address for n in self._obj.other_nodes)})
        newer, index = [], None
        for members, at, committed in self._voucher_configs.values():
            if self.self_addr not in members:
                continue
            if index is None:
                index = self._obj.config_index()  # a scan of the journal: only when a peer reports one
            if at > index:
                newer.append((at, members, committed))
        base = max((at for at, _, committed in newer if committed), default=None)
        out = [own] if base is None else []
        for at, members, _ in sorted(newer, key=lambda x: x[0]):
            if (base is None or at >= base) and members not in out:
                out.append(members)
        return [set(m) for m in out]

    def _vouch_shortfall(self, configurations: list[set] | None = None) -> list[tuple[set, int, list[str]]]:
        """Each configuration whose word is not in yet: (its members, peers needed, peers heard)."""
        short = []
        for members in configurations if configurations is not None else self._configurations():
            heard = sorted(a for a in self._vouchers if a in members and a != self.self_addr)
            if len(heard) < self._needed(members):
                short.append((members, self._needed(members), heard))
        return short

    def check_vouched(self) -> None:
        """Vouched once enough peers of each configuration (``_configurations``, ``_needed``) sent their
        verdict in this run: then the node reaches the highest log end they reported before it counts, and
        casts no vote up to their highest term (a vote of a lost run may be missing from its files).

        A start on the operator's word (``--trust-own-log``) is vouched from the start, but a recovery target
        it adopts (a peer saw it hold more than its files have: the word was wrong) is settled by the same
        words: lowered to the highest log end of enough peers, never kept above every log (a target on an
        entry no node holds, never committed, that held this node back for good)."""
        if self._peers_vouched or (self.vouched and self.recovery is None):
            return
        if any(v is True and not self._welcomed.get(a) for a, v in self._verified.items()):
            # A peer linked to this node has not given its word yet: it may report a configuration newer than
            # this node's own (a member added since, which lists this node and connects to it), which asks
            # for more words.  Its word follows its hello (or the link closes, and it is no longer waited for).
            return
        configurations = self._configurations()  # (a scan of the journal when a peer reported one: once)
        if self._vouch_shortfall(configurations):
            return
        members = set().union(*configurations) - {self.self_addr}
        have = sorted(a for a in self._vouchers if a in members)
        if not self.vouched:
            self.vouched = True
            if have:
                self._obj.vouched_term(max(self._vouchers[a][1] for a in have))
        targets = [t for a in have if (t := self._vouchers[a][0]) is not None]
        top = max(targets) if targets else None
        log.info("vouched for by %s (log end %s, theirs up to %s)", ", ".join(have), fmt_position(self.journal.durable_end()),
                 fmt_position(top) if top else "-")
        # Every entry this node may have acknowledged that was committed is on one of these peers' logs: a
        # majority held it, and these peers meet every majority the node was part of.  So the highest of their
        # log ends is the whole target.  A higher one from before (what a peer saw this node hold in an earlier
        # run, its own files' evidence, a target recorded before the last stop) names entries no majority
        # holds: never committed.  Kept, it can stall the cluster for good (a restored leader's own entry,
        # never committed, that no node holds any more, while every other node waits to reach this one's log).
        # An older peer reports no log end; then nothing is lowered.
        self._peers_vouched = True
        if self.recovery is not None and not (set(have) & self._unknown_ends) and (top is None or top < self.recovery):
            lowered = top if top is not None else (0, 0)
            log.warning("recovery target %s lowered to %s, the highest log end of the peers that vouched for this "
                        "start (%s): what lies above it was never committed", fmt_position(self.recovery), fmt_position(lowered),
                        ", ".join(have))
            self.journal.set_recovery_target(lowered)
            self.recovery, self.recovery_reason = lowered, (
                f"the peers that vouched for this start ({', '.join(have)}) hold {fmt_position(lowered)}")
            self.check_recovery()
        if top is not None:
            self.adopt_target(top, f"the peers that vouched for this start ({', '.join(have)}) hold "
                                   f"{fmt_position(top)}: a restored copy would lack what it acknowledged")

    def check_recovery(self) -> None:
        if self.recovery is None or self.journal.durable_end() < self.recovery:
            return
        self._obj.no_vote_this_term()  # a vote in this term may have been lost with the log: cast none
        self.journal.set_recovery_target(None)
        log.warning("caught up to %s (log now %s): this node votes and counts toward a majority again",
                    fmt_position(self.recovery), fmt_position(self.journal.durable_end()))
        self.recovery = self.recovery_reason = None
