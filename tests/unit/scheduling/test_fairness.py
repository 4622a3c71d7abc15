"""Fairness policies: one conformance suite over every registered policy, plus VTC specifics."""

from __future__ import annotations

import pytest

from fairq_server.scheduling.fairness import VtcFairness
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
    policy.charge_dispatch(t)
    policy.charge_tokens("a", 10, 10)
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
    vtc.charge_tokens("a", 100, 50)
    assert vtc.counter("a") == pytest.approx((100 + 2 * 50) / 2.0)


async def test_vtc_lifts_returning_user_to_min_backlogged_counter() -> None:
    vtc = VtcFairness()
    vtc.activate("a", 1.0)
    vtc.activate("b", 1.0)
    vtc.charge_tokens("a", 300, 0)
    vtc.charge_tokens("b", 500, 0)
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
        policy.charge_dispatch(t)
        policy.charge_tokens(one_off, 10, 10, 2.0)
        policy.deactivate(one_off)
        policy.select()
        policy.charge_dispatch(ticket("steady"))
        policy.charge_tokens("steady", 10, 10)
    assert len(policy._users) < 50  # type: ignore[attr-defined]


async def test_late_charges_use_the_request_weight_after_the_user_went_idle() -> None:
    vtc = VtcFairness()
    vtc.activate("x", 1.0)  # backlogged: charges to others matter relative to x
    vtc.activate("w", 4.0)
    vtc.deactivate("w")
    vtc.charge_tokens("w", 40, 0, 4.0)
    assert vtc.counter("w") == pytest.approx(10.0)


async def test_an_empty_tier_forgets_everyone_and_lifts_returners_to_the_top() -> None:
    vtc = VtcFairness()
    vtc.activate("a", 1.0)
    vtc.charge_tokens("a", 30, 0)
    vtc.deactivate("a")
    vtc.charge_tokens("late", 5, 5)  # nobody backlogged: nothing to be fair against
    assert vtc._users == {}  # type: ignore[attr-defined]
    vtc.activate("b", 1.0)
    assert vtc.counter("b") == 30
