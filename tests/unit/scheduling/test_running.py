"""Standing over what a user has outstanding: queued or running, not its queue alone.

A closed-loop caller's queue empties each time its request is dispatched and refills a moment
after the request ends. It was lifted to the smallest counter every time it came back, which
erased the standing it had built while it ran; now only a user with nothing outstanding is
lifted, in every policy and at both levels of teams, and one process forgets its history only
once nobody is queued or running.
"""

from __future__ import annotations

import pytest

from fairq_server.scheduling.counters import LocalCounters
from fairq_server.scheduling.fairness.hierarchy import TeamFairness, team_key
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.ordering import FifoOrdering
from fairq_server.scheduling.queue import TierQueue
from fairq_server.scheduling.registry import make_fairness

from .helpers import ticket


def tier(policy: str) -> TierQueue:
    counters = LocalCounters()
    return TierQueue(make_fairness(policy, counters=counters), FifoOrdering(), counters)


def counter(q: TierQueue, user: str) -> float:
    value = q.counters.get(user)
    assert value is not None, user
    return value


@pytest.mark.parametrize("policy", ["vtc", "round-robin"])
def test_a_caller_with_a_request_running_keeps_its_standing(policy: str) -> None:
    """An agent with two requests in flight: one ends, its next arrives while one runs."""
    q = tier(policy)
    for _ in range(8):
        q.push(ticket("deep", prompt="x" * 40))
    q.push(ticket("agent", prompt="x" * 40))
    q.push(ticket("agent", prompt="x" * 40))
    order = [q.pop() for _ in range(4)]
    assert [t.user for t in order] == ["deep", "agent", "deep", "agent"]
    for _ in range(3):
        q.pop("deep").stopped_running()  # deep is served on while the agent's requests run
    agent_before = counter(q, "agent")
    assert agent_before < counter(q, "deep")
    order[1].stopped_running()  # one of the agent's requests ends; its next arrives
    q.push(ticket("agent", prompt="x" * 40))
    # Its queue was empty, but it was never idle: the standing it built stays.
    assert counter(q, "agent") == agent_before
    assert q.fairness.select() == "agent"


@pytest.mark.parametrize("policy", ["vtc", "round-robin"])
def test_a_caller_with_nothing_outstanding_is_lifted(policy: str) -> None:
    q = tier(policy)
    for _ in range(6):
        q.push(ticket("deep", prompt="x" * 40))
    q.push(ticket("chat", prompt="x" * 40))
    q.pop()
    q.pop().stopped_running()  # chat's request ends, and chat sends nothing for a while
    for _ in range(3):
        q.pop("deep").stopped_running()
    q.push(ticket("chat", prompt="x" * 40))
    assert counter(q, "chat") == pytest.approx(counter(q, "deep"))  # idle time is not banked


def test_history_goes_only_once_nobody_is_queued_or_running() -> None:
    q = tier("vtc")
    q.push(ticket("a", prompt="x" * 10))
    q.push(ticket("b", prompt="x" * 10))
    a, b = q.pop(), q.pop()
    assert q.counters.get("a") is not None and q.counters.get("b") is not None
    a.stopped_running()
    assert q.counters.get("b") is not None  # b still runs: nobody's standing goes
    b.stopped_running()
    assert q.counters.get("a") is None and q.counters.get("b") is None
    assert len(q.outstanding) == 0


def test_teams_keep_their_standing_while_a_member_runs() -> None:
    counters = LocalCounters()
    policy = TeamFairness(lambda c: make_fairness("vtc", counters=c), counters)
    q = TierQueue(policy, FifoOrdering(), counters)

    def push(user: str, team: str) -> None:
        t = ticket(user, prompt="x" * 40)
        t.team, t.team_weight = team, 1.0
        q.push(t)

    for _ in range(8):
        push("d", "deep")
    push("c", "chat")
    push("c", "chat")
    order = [q.pop() for _ in range(4)]
    assert [t.user for t in order] == ["d", "c", "d", "c"]
    for _ in range(3):
        q.pop("d").stopped_running()
    chat_team = counters.get(team_key("chat"))
    assert chat_team is not None and chat_team < (counters.get(team_key("deep")) or 0.0)
    order[1].stopped_running()
    push("c", "chat")
    assert counters.get(team_key("chat")) == chat_team
    assert q.fairness.select() == "c"


class PlainPolicy:
    """A plugin that hears nothing of running requests: resumption tells it instead."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.active: list[str] = []

    def activate(self, user: str, weight: float, *, resume: bool = False) -> None:
        self.calls.append((user, resume))
        self.active.append(user)

    def deactivate(self, user: str) -> None:
        self.active.remove(user)

    def select(self) -> str:
        return self.active[0]

    def candidates(self, quantum: float, limit: int) -> list[str]:
        return self.active[:1]

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        pass


def test_a_policy_without_running_hooks_is_told_a_running_user_resumes() -> None:
    plain = PlainPolicy()
    q = TierQueue(plain, FifoOrdering())
    q.push(ticket("a"))
    t = q.pop()
    q.push(ticket("a"))  # a's first request still runs
    t.stopped_running()
    q.pop().stopped_running()
    q.push(ticket("a"))  # nothing outstanding any more
    assert plain.calls == [("a", False), ("a", True), ("a", False)]
