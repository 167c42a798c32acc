"""Raft for the quorum: pysyncobj (pinned) with pidquorum's rules where pysyncobj's are unsafe.

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
``node``            ``RaftNode``, the facade the rest of the quorum uses: start-up, proposals,
                    membership, status, the snapshot files; it mixes in ``loop``, ``recovery``
                    and ``peers``
``loop``            how the node is ticked (its asyncio loop, or the simulator), fail-stop
``recovery``        the recovery gate: who may vote, stand and count after a start
``peers``           the identity checks on hellos, welcomes, refusals and pings
``replication``     Raft's rules as they run (``Replicated``): messages, commit, snapshots,
                    compaction, configurations; it mixes in ``elections`` and ``following``
``elections``       pre-vote, the campaign, check-quorum's lease, answers to vote requests
``following``       a follower's AppendEntries: log matching, acknowledgement, install
``nodeside``        what the replication rules use of their node (a Protocol)
``fields``          checks on a peer message's fields
``files``           the node's Raft files at start: snapshot and journal made to agree
``gate``            every message: durable before it leaves, identity before it is read, the
                    link's encryption
``transport``       the Raft port: links, limits, outside peers
``config``          ``[raft]`` settings, proposal outcomes
``upstream``        the only module that imports pysyncobj: its private state under plain names,
                    the table of what is replaced and why, the pinned version's digests
==================  ==========================================================================
"""
from .config import ProposalRejected, ProposalUnknown, RaftConfig
from .files import NodeFiles, fmt_position, loss_evidence, open_node_files, reconcile
from .gate import Gate
from .node import FOLLOWER_APPLY_S, MAX_MEMBERS, RaftNode
from .replication import COMMIT_NOTIFY_S, RECOVERED_VOTE, Replicated, configuration_before
from .transport import REVERSE_LINK, TcpTransport
from .upstream import MessageTransport, Node, clock, driven_by

__all__ = ["COMMIT_NOTIFY_S", "FOLLOWER_APPLY_S", "Gate", "MAX_MEMBERS", "MessageTransport", "Node", "NodeFiles",
           "ProposalRejected", "ProposalUnknown", "RECOVERED_VOTE", "REVERSE_LINK", "RaftConfig", "RaftNode",
           "Replicated", "TcpTransport", "clock", "configuration_before", "driven_by", "fmt_position",
           "loss_evidence", "open_node_files", "reconcile"]
