"""Exact dispatch order of the model queue: tiers, then round-robin users, then FIFO."""

from __future__ import annotations

import pytest

from fairq_server.scheduling.fairness import RoundRobinFairness
from fairq_server.scheduling.ordering import FifoOrdering, ShortestFirstOrdering
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.ticket import Ticket, TicketState

from .helpers import ticket


def drain(q: ModelQueue) -> list[Ticket]:
    out = []
    while (tier := q.first_tier()) is not None:
        out.append(q.pop(tier))
    return out


def names(tickets: list[Ticket], labels: dict[int, str]) -> list[str]:
    return [labels[t.seq] for t in tickets]


def make_queue(tiers: int = 3, ordering: object = None) -> ModelQueue:
    return ModelQueue(tiers, RoundRobinFairness, ordering or FifoOrdering())  # type: ignore[arg-type]


async def test_mixed_tiers_and_users_dispatch_in_exact_order() -> None:
    q = make_queue()
    labels: dict[int, str] = {}
    # Added out of order: batch first, then a power user, then others.
    plan = [
        ("batch-x1", "x", 2),
        ("a1", "a", 1),
        ("a2", "a", 1),
        ("a3", "a", 1),
        ("b1", "b", 1),
        ("i-c1", "c", 0),
        ("batch-x2", "x", 2),
        ("b2", "b", 1),
        ("i-d1", "d", 0),
        ("i-c2", "c", 0),
    ]
    for label, user, tier in plan:
        t = ticket(user, tier)
        labels[t.seq] = label
        q.push(t)
    assert len(q) == 10
    order = names(drain(q), labels)
    assert order == [
        # tier 0: c arrived before d; round robin c, d, c
        "i-c1", "i-d1", "i-c2",
        # tier 1: a activated before b; one each per turn, FIFO within a user
        "a1", "b1", "a2", "b2", "a3",
        # tier 2
        "batch-x1", "batch-x2",
    ]  # fmt: skip
    assert len(q) == 0
    assert q.first_tier() is None


async def test_returning_user_cannot_bank_idle_time() -> None:
    q = make_queue(1)
    labels: dict[int, str] = {}

    def push(label: str, user: str) -> None:
        t = ticket(user)
        labels[t.seq] = label
        q.push(t)

    for i in range(4):
        push(f"a{i}", "a")
    push("b0", "b")
    assert names([q.pop(0), q.pop(0), q.pop(0)], labels) == ["a0", "b0", "a1"]
    # b was idle while a was served; on return b is lifted to a's counter (2), so it gets no
    # burst for the turn it missed. On the tie b goes first, as it would in a round-robin
    # rotation: a reached 2 by being served just now, b was lifted there without a turn.
    push("b1", "b")
    push("b2", "b")
    assert names(drain(q), labels) == ["b1", "a2", "b2", "a3"]


async def test_removed_tickets_are_skipped_and_counts_stay_exact() -> None:
    q = make_queue(1)
    a1, a2, b1 = ticket("a"), ticket("a"), ticket("b")
    for t in (a1, a2, b1):
        q.push(t)
    q.remove(a1)
    assert len(q) == 2
    assert q.user_len("a") == 1
    q.remove(b1)
    assert q.user_len("b") == 0
    assert drain(q) == [a2]


async def test_a_ticket_removed_and_queued_again_twice_comes_out_once() -> None:
    # A preempted request goes back to the queue, is taken out to resume in its slot, and may
    # be preempted again. Its first removed entry used to stay in the heap under a removal
    # mark that hid only one of the two: the ticket then came out while it was running.
    q = make_queue(1)
    a1, a2 = ticket("a"), ticket("a")
    q.push(a1)
    q.push(a2)
    for _ in range(2):
        q.remove(a1)
        q.push(a1, resume=True)
    q.remove(a1)
    assert len(q) == 1 and q.user_len("a") == 1
    assert drain(q) == [a2]
    assert len(q) == 0


async def test_removing_a_users_last_ticket_deactivates_the_user() -> None:
    q = make_queue(1)
    a1, b1, b2 = ticket("a"), ticket("b"), ticket("b")
    for t in (a1, b1, b2):
        q.push(t)
    q.remove(a1)
    assert q.tiers[0].active_users == 1
    assert drain(q) == [b1, b2]


async def test_retry_goes_ahead_of_everything_in_its_tier() -> None:
    q = make_queue(2)
    a1, b1, r = ticket("a"), ticket("b"), ticket("c")
    q.push(a1)
    q.push(b1)
    q.push(r, front=True)
    assert q.pop(0) is r
    assert drain(q) == [a1, b1]


async def test_shortest_first_orders_within_a_user_only() -> None:
    q = make_queue(1, ShortestFirstOrdering())
    long_a = ticket("a", max_tokens=500)
    short_a = ticket("a", max_tokens=5)
    long_b = ticket("b", max_tokens=900)
    for t in (long_a, short_a, long_b):
        q.push(t)
    # a goes first (activated first) with its shortest request; b's turn is not taken away.
    assert drain(q) == [short_a, long_b, long_a]


async def test_position_estimate_counts_higher_tiers_and_one_round() -> None:
    q = make_queue(2)
    assert q.push(ticket("hi", 0)) == 0
    for _ in range(5):
        q.push(ticket("a", 1))
    # b's first request waits behind the interactive one and one request of a.
    assert q.push(ticket("b", 1)) == 2
    assert q.push(ticket("b", 1)) == 4


async def test_pop_empty_raises_index_error() -> None:
    q = make_queue(1)
    with pytest.raises(IndexError):
        q.pop(0)


async def test_push_marks_ticket_queued() -> None:
    q = make_queue(1)
    t = ticket("a")
    q.push(t)
    assert t.state is TicketState.QUEUED


async def test_vtc_does_not_give_every_free_slot_to_one_user() -> None:
    from fairq_server.scheduling.fairness import VtcFairness

    q = ModelQueue(1, VtcFairness, FifoOrdering())
    for user in "abc":
        for _ in range(4):
            q.push(ticket(user, prompt="x" * 40))
    # One dispatch pass with six free slots: the prompt is charged on admission, so the
    # slots go round the users instead of all to the first.
    assert [q.pop(0).user for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
