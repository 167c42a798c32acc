"""quorum.client.leader.pick_leader (which DescribeState answers name a leader) and QuorumClient.find_leader
(asking every node, again until a deadline), against scripted answers."""
from __future__ import annotations

import asyncio

import pytest

from quorum.client.leader import pick_leader
from quorum.client.quorum import ConnectionFailed, QuorumClient, RetryPolicy
from records.wire.errors import NotControllerError


def node(self: str, state: str, term: int, leader: str | None = None) -> dict:
    if state == "leader" and leader is None:
        leader = self
    return {"raft": {"self": self, "state": state, "term": term, "leader": leader}}


def test_no_answer_or_no_node_that_leads_is_no_leader():
    assert pick_leader({}) is None
    assert pick_leader({1: None, 2: None}) is None
    assert pick_leader({1: node("r1", "follower", 3), 2: node("r2", "candidate", 4)}) is None


def test_the_node_that_leads_and_its_followers():
    answers = {1: node("r1", "follower", 5, "r2"), 2: node("r2", "leader", 5), 3: node("r3", "follower", 5, "r2")}
    assert pick_leader(answers) == 2
    assert pick_leader({2: answers[2]}) == 2  # alone, nobody says otherwise
    assert pick_leader({**answers, 3: None}) == 2  # a node that did not answer does not count
    assert pick_leader({"a:1": node("r1", "follower", 5, None), "a:2": node("r2", "leader", 5)}) == "a:2"


def test_a_stale_leader_in_an_older_term_loses_to_the_newer_one():
    answers = {1: node("r1", "leader", 3), 2: node("r2", "leader", 4), 3: node("r3", "follower", 4, "r2")}
    assert pick_leader(answers) == 2
    assert pick_leader({1: answers[1], 2: answers[2]}) == 2


def test_a_leader_deposed_by_a_later_term_with_another_leader_is_none():
    """The woken leader of term 3 still says so; the others follow r3 in term 4, which did not answer."""
    assert pick_leader({1: node("r1", "leader", 3), 2: node("r2", "follower", 4, "r3")}) is None


def test_split_answers_in_one_term_are_none():
    assert pick_leader({1: node("r1", "leader", 4), 2: node("r2", "leader", 4)}) is None
    assert pick_leader({1: node("r1", "leader", 4), 2: node("r2", "follower", 4, "r3")}) is None


def test_a_node_whose_term_ran_ahead_without_a_leader_does_not_count():
    """A node cut off from the others campaigns over and over: a higher term, no leader."""
    answers = {1: node("r1", "candidate", 9), 2: node("r2", "leader", 4), 3: node("r3", "follower", 4, "r2")}
    assert pick_leader(answers) == 2
    # a follower still in an older term, following the old leader, is behind: no objection either
    assert pick_leader({**answers, 3: node("r3", "follower", 3, "r1")}) == 2
    # a follower that already saw the leader win a later term than its own answer said
    assert pick_leader({2: node("r2", "leader", 4), 3: node("r3", "follower", 5, "r2")}) == 2


class Scripted(QuorumClient):
    """describe() answers from a list of rounds: {address: answer or exception}."""

    def __init__(self, rounds, **kw):
        super().__init__(list(rounds[0]), **kw)
        self.rounds = list(rounds)
        self.asked: list[str] = []
        self.round = 0

    async def describe(self, address, action=None):
        self.asked.append(address)
        answer = self.rounds[min(self.round, len(self.rounds) - 1)][address]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def describe_each(self, addresses=None):
        try:
            return await super().describe_each(addresses)
        finally:
            self.round += 1


def test_find_leader_returns_the_leader_s_address_and_answer():
    c = Scripted([{"a": node("r1", "follower", 2, "r2"), "b": node("r2", "leader", 2),
                   "c": ConnectionFailed("c: refused")}])
    address, d = asyncio.run(c.find_leader(0))
    assert address == "b" and d["raft"]["self"] == "r2"


def test_find_leader_with_no_time_asks_once_and_says_what_each_node_said():
    c = Scripted([{"a": node("r1", "follower", 2, "r2"), "b": ConnectionFailed("b: refused"),
                   "c": node("r3", "leader", 1)}, {"a": node("r1", "leader", 3), "b": None, "c": None}])
    with pytest.raises(NotControllerError) as e:
        asyncio.run(c.find_leader(0))
    assert c.round == 1
    assert e.value.message == "no leader among a: follower, b: ConnectionFailed, c: leader (term 1)"


def test_find_leader_asks_again_until_a_leader_appears_or_the_deadline():
    no_leader = {"a": node("r1", "candidate", 2), "b": node("r2", "candidate", 2)}
    c = Scripted([no_leader, no_leader, {"a": node("r1", "follower", 3, "r2"), "b": node("r2", "leader", 3)}],
                 policy=RetryPolicy(timeout=5.0))
    assert asyncio.run(c.find_leader())[0] == "b" and c.round == 3
    c = Scripted([no_leader])
    loop_time = []

    async def go():
        t0 = asyncio.get_running_loop().time()
        try:
            await c.find_leader(0.2)
        finally:
            loop_time.append(asyncio.get_running_loop().time() - t0)
    with pytest.raises(NotControllerError):
        asyncio.run(go())
    assert 0.15 <= loop_time[0] < 2.0 and c.round >= 3


def test_find_leader_waits_past_an_excluded_leader_and_asks_only_the_given_addresses():
    old = {"a": node("r1", "leader", 2), "b": node("r2", "follower", 2, "r1"), "c": node("r3", "follower", 2, "r1")}
    new = {"a": ConnectionFailed("a: refused"), "b": node("r2", "leader", 3), "c": node("r3", "follower", 3, "r2")}
    c = Scripted([old, new])
    assert asyncio.run(c.find_leader(5.0, exclude={"a"}))[0] == "b"
    c = Scripted([old])
    with pytest.raises(NotControllerError, match="no leader other than a among a: leader"):
        asyncio.run(c.find_leader(0, exclude=["a"]))
    c = Scripted([new])
    assert asyncio.run(c.find_leader(0, addresses=["b"]))[0] == "b" and c.asked == ["b"]
