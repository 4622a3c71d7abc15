"""Fairness policies: one conformance suite over every registered policy, plus VTC specifics."""

from __future__ import annotations

import copy
import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairq_server.scheduling.fairness import CounterFairness, VtcFairness
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.registry import (
    FAIRNESS_POLICIES,
    ORDERING_POLICIES,
    make_fairness,
    make_ordering,
)

from .helpers import ticket


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
async def test_conformance_select_only_returns_active_users(name: str) -> None:
    policy = make_fairness(name)
    with pytest.raises(IndexError):
        policy.select()
    policy.activate("a", 1.0)
    policy.activate("b", 1.0)
    assert policy.select() == "a"  # equal counters: first activated first
    policy.deactivate("a")
    assert policy.select() == "b"
    policy.deactivate("b")
    with pytest.raises(IndexError):
        policy.select()


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
async def test_conformance_charged_user_yields_its_turn(name: str) -> None:
    policy = make_fairness(name)
    policy.activate("a", 1.0)
    policy.activate("b", 1.0)
    t = ticket("a")
    policy.charge(t.user, Cost(requests=1, prompt_tokens=t.prompt_tokens), t.weight)
    policy.charge("a", Cost(prompt_tokens=10, completion_tokens=10))
    assert policy.select() == "b"
    assert policy.counter("a") > policy.counter("b")


def test_unknown_policy_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="round-robin, vtc"):
        make_fairness("lottery")
    with pytest.raises(ValueError, match="fifo, shortest-first"):
        make_ordering("random")
    assert set(ORDERING_POLICIES) == {"fifo", "shortest-first"}


async def test_vtc_charges_input_plus_twice_output_over_weight() -> None:
    vtc = VtcFairness()
    vtc.activate("a", 2.0)
    vtc.charge("a", Cost(prompt_tokens=100, completion_tokens=50))
    assert vtc.counter("a") == pytest.approx((100 + 2 * 50) / 2.0)


async def test_vtc_lifts_returning_user_to_min_backlogged_counter() -> None:
    vtc = VtcFairness()
    vtc.activate("a", 1.0)
    vtc.activate("b", 1.0)
    vtc.charge("a", Cost(prompt_tokens=300, completion_tokens=0))
    vtc.charge("b", Cost(prompt_tokens=500, completion_tokens=0))
    vtc.deactivate("c")  # unknown users are ignored
    vtc.activate("c", 1.0)  # new user, backlogged minimum is a's 300
    assert vtc.counter("c") == 300
    assert vtc.min_counter() == 300


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
async def test_memory_follows_active_users_not_every_name_ever_seen(name: str) -> None:
    policy = make_fairness(name)
    policy.activate("steady", 1.0)
    for i in range(5000):
        one_off = f"user-{i}"
        policy.activate(one_off, 1.0)
        t = ticket(one_off)
        policy.charge(t.user, Cost(requests=1, prompt_tokens=t.prompt_tokens), t.weight)
        policy.charge(one_off, Cost(prompt_tokens=10, completion_tokens=10), 2.0)
        policy.deactivate(one_off)
        policy.select()
        policy.charge("steady", Cost(requests=1))
        policy.charge("steady", Cost(prompt_tokens=10, completion_tokens=10))
    assert len(policy._users) < 50  # type: ignore[attr-defined]


async def test_late_charges_use_the_request_weight_after_the_user_went_idle() -> None:
    vtc = VtcFairness()
    vtc.activate("x", 1.0)  # backlogged: charges to others matter relative to x
    vtc.activate("w", 4.0)
    vtc.deactivate("w")
    vtc.charge("w", Cost(prompt_tokens=40, completion_tokens=0), 4.0)
    assert vtc.counter("w") == pytest.approx(10.0)


async def test_an_empty_tier_forgets_everyone_and_lifts_returners_to_the_top() -> None:
    vtc = VtcFairness()
    vtc.activate("a", 1.0)
    vtc.charge("a", Cost(prompt_tokens=30, completion_tokens=0))
    vtc.deactivate("a")
    vtc.charge(
        "late", Cost(prompt_tokens=5, completion_tokens=5)
    )  # nobody backlogged: nothing to be fair against
    assert vtc._users == {}  # type: ignore[attr-defined]
    vtc.activate("b", 1.0)
    assert vtc.counter("b") == 30


# -- candidates() against the obvious implementation ---------------------------------------


def _candidates_by_popping(policy: CounterFairness, quantum: float, limit: int) -> list[str]:
    """Reference: pop valid entries off a copy of the heap (re-keying stale ones as select()
    does) until ``limit`` or the bound; ``candidates`` must return exactly these, in order."""
    probe = copy.deepcopy(policy)
    top = probe._clean_top()
    if top is None:
        return []
    bound = top[0] + quantum
    taken: list[str] = []
    while len(taken) < limit:
        entry = probe._clean_top()
        if entry is None or entry[0] > bound:
            break
        taken.append(heapq.heappop(probe._heap)[2])
    return taken


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["activate", "deactivate", "charge", "select"]),
        st.sampled_from([f"u{i}" for i in range(12)]),
        st.integers(0, 3),  # small whole charges: many equal counters, so ties matter
    ),
    max_size=120,
)


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
@settings(max_examples=200, deadline=None)
@given(ops=_OPS, quantum=st.sampled_from([0.0, 1.0, 3.0, 50.0]), limit=st.integers(1, 8))
def test_candidates_match_popping_the_heap(
    name: str, ops: list[tuple[str, str, int]], quantum: float, limit: int
) -> None:
    policy = make_fairness(name)
    assert isinstance(policy, CounterFairness)
    for op, user, amount in ops:
        if op == "activate":
            policy.activate(user, 1.0)
        elif op == "deactivate":
            policy.deactivate(user)
        elif op == "charge":
            policy._add(user, float(amount))
        elif policy._clean_top() is not None:
            policy.select()
        expected = _candidates_by_popping(policy, quantum, limit)
        assert policy.candidates(quantum, limit) == expected


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_candidates_rank_an_entry_charged_in_place_after_an_equal_counter(name: str) -> None:
    """u1 was charged to 2 while deep in the heap; u4 came back at 2 since. select() would
    re-key u1 when it surfaces, with a newer stamp than u4's, so u4 ranks first."""
    policy = make_fairness(name)
    assert isinstance(policy, CounterFairness)
    for user in ("u3", "u1", "u4"):
        policy.activate(user, 1.0)
    policy._add("u4", 2.0)
    policy.deactivate("u4")
    policy._add("u1", 2.0)
    policy.activate("u4", 1.0)
    assert policy.candidates(5.0, 8) == ["u3", "u4", "u1"] == _candidates_by_popping(policy, 5.0, 8)
