"""Messages handed to one in-process node's Raft layer as if a peer had sent them, on the node's own thread
(test_durability, test_liveness): the node runs for real, its peers are only their addresses."""
from __future__ import annotations

import threading

from quorum.raft import Node


def fake_peer(c, node_id):
    """Node ``node_id`` of the SimCluster ``c`` as a message's sender (whether it runs or not)."""
    return Node(c.nodes[node_id].cfg.raft_address)


def on_raft(node, fn):
    """Run ``fn()`` in the node's next tick; wait for it."""
    done = threading.Event()

    def go():
        try:
            fn()
        finally:
            done.set()
    node.raft._on_raft_thread(go)
    assert done.wait(5)


def deliver(node, peer, message):
    """Hand ``message`` to the node's Raft layer on its own thread, as if ``peer`` sent it; wait for it."""
    on_raft(node, lambda: node.raft._obj.on_message(peer, message))


def vouch(n, c, peer_id, log_end, held, recover=None, term=3, older=False):
    """Peer ``peer_id``'s verdict on node ``n``'s start, as its welcome carries it."""
    message = {"type": "pq_welcome", "by": c.nodes[peer_id].cfg.raft_address, "recover": recover}
    if not older:
        message["vouch"] = {"log_end": log_end, "held": held, "term": term}
    on_raft(n, lambda: n.raft._on_welcome(fake_peer(c, peer_id), message))
