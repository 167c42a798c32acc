"""Membership changes: remove a member, add a fresh one, hand leadership over.

pysyncobj has no learners (an added node votes at once), so these refuse any step that could make a new
member needed for a majority before it holds the log: no removal of the leader or of a member whose loss
leaves no connected majority, no add unless every member is connected and caught up.  The order and why
it suffices: ``docs/operations.md`` ("Replacing a dead node").
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from records.wire.errors import InvalidRequestError, NotControllerError, RequestTimedOutError

from .raft import ProposalRejected, ProposalUnknown

ACTIONS = ("add_node", "remove_node", "transfer_leadership")
CAUGHT_UP_POLL = 0.05


def _address(body: dict, key: str = "address", required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    host, sep, port = str(value).rpartition(":") if isinstance(value, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequestError(f"{key}: expected host:port, got {value!r}")
    return value


def _timeout(body: dict, key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        raise InvalidRequestError(f"{key}: expected seconds in (0, 3600], got {value!r}")
    return float(value)


async def handle(service: Any, action: str, body: dict) -> dict:
    """Run a membership action on this node, which must be the leader."""
    raft = service.raft
    is_leader, leader, _ = raft.role()
    if not is_leader:
        raise NotControllerError(f"membership changes are made on the leader (now {leader or 'none'})")
    timeout = service.cfg.request_timeout_ms / 1000
    loop = asyncio.get_running_loop()
    try:
        if action == "add_node":
            address = _address(body)
            catch_up = _timeout(body, "catch_up_timeout", 60.0)
            return await _add(raft, loop, address, timeout, catch_up)
        if action == "remove_node":
            address = _address(body)
            return await _remove(raft, loop, address, timeout)
        target = _address(body, required=False)
        return await _transfer(raft, loop, target, _timeout(body, "wait", 10.0))
    except ProposalRejected as e:
        raise InvalidRequestError(f"{action} refused by the leader: {e}") from None
    except ProposalUnknown as e:
        raise RequestTimedOutError(f"{action}: {e}; check 'pidctl quorum status' before trying again") from None


async def _wait_caught_up(raft: Any, address: str, index: int, deadline: float) -> dict | None:
    while True:
        peer = raft.status()["peers"].get(address)
        if peer and peer["connected"] and (peer["match_index"] or 0) >= index:
            return peer
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(CAUGHT_UP_POLL)


async def _add(raft: Any, loop: Any, address: str, timeout: float, catch_up: float) -> dict:
    status = raft.status()
    if address in status["members"]:
        raise InvalidRequestError(f"{address} is already a member ({', '.join(status['members'])})")
    commit = status["commit_index"]
    deadline = time.monotonic() + min(timeout, 5.0)
    for peer in status["peers"]:
        if await _wait_caught_up(raft, peer, commit, deadline) is None:
            raise InvalidRequestError(
                f"member {peer} is not connected or not caught up (commit index {commit}): a node is added only "
                f"while every current member is up to date, so the new one is never needed for a majority before "
                f"it holds the log; remove dead members first ('pidctl quorum remove-node'), one at a time")
    started = time.monotonic()
    await loop.run_in_executor(None, raft.add_member, address, timeout)
    target = raft.status()["commit_index"]
    peer = await _wait_caught_up(raft, address, target, time.monotonic() + catch_up)
    return {"members": raft.status()["members"], "added": address, "caught_up": peer is not None,
            "catch_up_index": target, "match_index": (peer or {}).get("match_index"),
            "catch_up_seconds": round(time.monotonic() - started, 3)}


async def _remove(raft: Any, loop: Any, address: str, timeout: float) -> dict:
    status = raft.status()
    if address == status["self"]:
        raise InvalidRequestError(f"{address} is the leader: hand leadership over first "
                                  f"('pidctl quorum transfer-leadership'), then remove it")
    if address not in status["members"]:
        raise InvalidRequestError(f"{address} is not a member ({', '.join(status['members'])})")
    remaining = [m for m in status["members"] if m != address]
    connected = 1 + sum(1 for a, p in status["peers"].items() if a != address and p["connected"])
    if connected <= len(remaining) / 2:
        raise InvalidRequestError(f"removing {address} would leave {len(remaining)} members of which only "
                                  f"{connected} are connected: no majority; bring members back first")
    await loop.run_in_executor(None, raft.remove_member, address, timeout)
    return {"members": raft.status()["members"], "removed": address}


async def _transfer(raft: Any, loop: Any, target: str | None, wait: float) -> dict:
    status = raft.status()
    me = status["self"]
    if target is not None and (target == me or target not in status["members"]):
        raise InvalidRequestError(f"{target} is {'this leader' if target == me else 'not a member'}")
    deadline = time.monotonic() + wait
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            # pysyncobj denies it while the target is behind the leader's last entry: retry briefly.
            await loop.run_in_executor(None, raft.transfer_leadership, target, 2.0)
        except ProposalRejected as e:
            last_error = e
            await asyncio.sleep(0.05)
            continue
        while time.monotonic() < deadline:
            is_leader, leader, term = raft.role()
            if not is_leader and leader is not None and leader != me:
                return {"previous_leader": me, "leader": leader, "term": term}
            await asyncio.sleep(CAUGHT_UP_POLL)
    raise RequestTimedOutError(f"leadership not transferred within {wait:.1f}s"
                               + (f" (last answer: {last_error})" if last_error else ""))


# --------------------------------------------------------------------------
# The operator's side (``pidctl quorum add-node|remove-node|transfer-leadership``):
# find the leader among the given client addresses (``QuorumClient.find_leader``,
# one round: a dead member is expected here, we may be replacing it) and ask it.


async def add_node(client: Any, addresses: list[str], raft_address: str, client_address: str,
                   catch_up_timeout: float, timeout: float) -> dict:
    leader_address, leader = await client.find_leader(0, addresses=addresses)
    try:
        new = await client.describe(client_address)
    except Exception as e:  # noqa: BLE001 - any failure means: not running there
        raise RequestTimedOutError(f"the new node does not answer on {client_address} ({type(e).__name__}: {e}): "
                                   f"start it first (empty data directory, this cluster's cluster_id and "
                                   f"secret, the current members as peers)") from None
    raft = new["raft"]
    if raft["self"] != raft_address:
        raise InvalidRequestError(f"the node at {client_address} has Raft address {raft['self']}, not {raft_address}")
    want = leader["raft"]["identity"]["cluster_id"]
    if raft["identity"]["cluster_id"] != want:
        raise InvalidRequestError(f"the node at {client_address} is in cluster {raft['identity']['cluster_id']}, "
                                  f"not {want}: set cluster_id = \"{want}\" in its config and give it an empty "
                                  f"data directory")
    if raft_address in leader["raft"]["members"]:
        raise InvalidRequestError(f"{raft_address} is already a member")
    resp = await client.admin(leader_address, {"action": "add_node", "address": raft_address,
                                               "catch_up_timeout": catch_up_timeout},
                              timeout + catch_up_timeout)
    resp.pop("error_code", None)
    resp["leader"] = leader["raft"]["self"]
    return resp


async def remove_node(client: Any, addresses: list[str], raft_address: str, timeout: float) -> dict:
    leader_address, leader = await client.find_leader(0, addresses=addresses)
    resp = await client.admin(leader_address, {"action": "remove_node", "address": raft_address}, timeout)
    resp.pop("error_code", None)
    resp["leader"] = leader["raft"]["self"]
    return resp


async def transfer_leadership(client: Any, addresses: list[str], target: str | None, timeout: float) -> dict:
    leader_address, _ = await client.find_leader(0, addresses=addresses)
    body: dict = {"action": "transfer_leadership", "wait": timeout}
    if target:
        body["address"] = target
    resp = await client.admin(leader_address, body, timeout + 2.0)
    resp.pop("error_code", None)
    return resp
