"""Hierarchical fairness: the configured policy between teams, then within each team."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fairq_server.scheduling.counters import JournaledCounters, LocalCounters, PeerHeads
from fairq_server.scheduling.fairness.hierarchy import TEAM_TAG, TeamFairness, team_key
from fairq_server.scheduling.interfaces import Cost, ServiceCounters
from fairq_server.scheduling.ordering import FifoOrdering
from fairq_server.scheduling.queue import TierQueue
from fairq_server.scheduling.registry import FAIRNESS_POLICIES, make_fairness

from .helpers import ticket

ONE = Cost(requests=1, prompt_tokens=10)


def teams(name: str, counters: ServiceCounters | None = None) -> TeamFairness:
    return TeamFairness(lambda c: make_fairness(name, counters=c), counters)


def serve(policy: TeamFairness, n: int, team_of: dict[str, tuple[str, float]]) -> list[str]:
    """Serve ``n`` picks, charging each one request of 10 prompt tokens (as dispatch does)."""
    out = []
    for _ in range(n):
        user = policy.select()
        out.append(user)
        team, weight = team_of[user]
        policy.charge_in(user, ONE, 1.0, team, weight)
    return out


TWO_TO_ONE = {"a1": ("A", 2.0), "a2": ("A", 2.0), "a3": ("A", 2.0), "b1": ("B", 1.0)}


def backlog(policy: TeamFairness, team_of: dict[str, tuple[str, float]]) -> None:
    for user, (team, weight) in team_of.items():
        policy.activate_in(user, 1.0, team, weight)


def test_vtc_serves_teams_by_weight_then_users_in_turn_exact_order() -> None:
    policy = teams("vtc")
    backlog(policy, TWO_TO_ONE)
    order = serve(policy, 12, TWO_TO_ONE)
    assert order == ["a1", "b1", "a2", "b1", "a3", "a1", "b1", "a2", "a3", "b1", "a1", "a2"]


def test_vtc_two_to_one_teams_get_two_thirds_and_one_third_users_equal_inside() -> None:
    policy = teams("vtc")
    backlog(policy, TWO_TO_ONE)
    served = Counter(serve(policy, 3000, TWO_TO_ONE))
    team_a = served["a1"] + served["a2"] + served["a3"]
    assert abs(team_a / 3000 - 2 / 3) <= 0.002, served
    assert abs(served["b1"] / 3000 - 1 / 3) <= 0.002, served
    assert (
        max(served[u] for u in ("a1", "a2", "a3")) - min(served[u] for u in ("a1", "a2", "a3")) <= 1
    ), served


def test_round_robin_takes_turns_between_teams_then_between_members() -> None:
    """Round-robin gives turns, not weighted shares, at both levels (as between users)."""
    policy = teams("round-robin")
    backlog(policy, TWO_TO_ONE)
    order = serve(policy, 12, TWO_TO_ONE)
    assert order == ["a1", "b1", "a2", "b1", "a3", "b1", "a1", "b1", "a2", "b1", "a3", "b1"]


def test_a_big_team_gets_no_more_than_a_lone_user_of_equal_weight() -> None:
    """Teams, not users, share the tier: ten users of one team count as one entry."""
    team_of = {f"t{i}": ("T", 1.0) for i in range(10)}
    policy = teams("vtc")
    backlog(policy, team_of)
    policy.activate("solo", 1.0)  # no team: its own team of weight 1
    team_of["solo"] = (None, 1.0)  # type: ignore[assignment]
    served = Counter(serve(policy, 200, team_of))
    assert served["solo"] == 100, served


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_without_teams_the_composition_is_the_configured_policy(name: str) -> None:
    """Every user its own team: the same picks, candidates and counters as the policy alone."""
    rng = random.Random(7)
    plain_counters, team_counters = LocalCounters(), LocalCounters()
    plain = make_fairness(name, counters=plain_counters)
    composed = teams(name, team_counters)
    active: set[str] = set()
    for _ in range(2000):
        op = rng.random()
        user = f"u{rng.randrange(6)}"
        if op < 0.3 and user not in active:
            weight = rng.choice([0.5, 1.0, 3.0])
            plain.activate(user, weight)
            composed.activate(user, weight)
            active.add(user)
        elif op < 0.45 and user in active:
            plain.deactivate(user)
            composed.deactivate(user)
            active.discard(user)
        elif active:
            assert composed.candidates(15.0, 3) == plain.candidates(15.0, 3)
            chosen = plain.select()
            assert composed.select() == chosen
            cost = Cost(requests=1, prompt_tokens=rng.randrange(1, 50))
            plain.charge(chosen, cost)
            composed.charge(chosen, cost)
        assert team_counters._values == plain_counters._values


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_conformance_with_every_user_in_a_team(name: str) -> None:
    """The FairnessPolicy contract, each registered policy at both levels."""
    policy = teams(name)
    with pytest.raises(IndexError):
        policy.select()
    for user, team in (("a", "X"), ("b", "Y"), ("c", "X")):
        policy.activate_in(user, 1.0, team, 1.0)
    policy.deactivate("b")
    for _ in range(20):
        chosen = policy.select()
        assert chosen in {"a", "c"}
        candidates = policy.candidates(1e9, 8)
        assert candidates[0] == chosen
        assert set(candidates) <= {"a", "c"} and len(candidates) == len(set(candidates))
        assert len(policy.candidates(1e9, 1)) == 1
        policy.charge_in(chosen, Cost(requests=1, prompt_tokens=10), None, "X", 1.0)
    policy.charge_in("ghost", Cost(completion_tokens=5), 2.0, "Z", 3.0)  # idle, unknown team
    policy.deactivate("a")
    policy.deactivate("c")
    with pytest.raises(IndexError):
        policy.select()


def test_candidates_go_through_the_best_team_first_then_the_next() -> None:
    policy = teams("vtc")
    backlog(policy, TWO_TO_ONE)
    assert policy.candidates(1e9, 8) == ["a1", "a2", "a3", "b1"]
    assert policy.candidates(1e9, 2) == ["a1", "a2"]
    assert policy.candidates(0.0, 8)[0] == policy.select()


def test_team_and_user_of_the_same_name_keep_apart_counters() -> None:
    counters = LocalCounters()
    policy = teams("vtc", counters)
    policy.activate("ops", 1.0)  # a user named like the team, without a team
    policy.activate_in("ops", 1.0, "ops", 1.0)  # already backlogged: keeps its first team
    policy.activate_in("alice", 1.0, "ops", 1.0)
    policy.charge_in("alice", Cost(prompt_tokens=100), 1.0, "ops", 1.0)
    assert counters.get("ops") == 0.0
    assert counters.get(team_key("ops")) == 100.0
    assert counters.get(team_key("ops") + "\x1falice") == 100.0
    assert policy.level_key("alice") == TEAM_TAG + "ops"
    assert policy.level_key("ops") == "ops"


def test_a_team_weight_changed_by_a_reload_applies_to_the_next_charges() -> None:
    counters = LocalCounters()
    policy = teams("vtc", counters)
    policy.activate_in("a", 1.0, "A", 1.0)
    policy.charge_in("a", Cost(prompt_tokens=100), 1.0, "A", 1.0)
    policy.charge_in("a", Cost(prompt_tokens=100), 1.0, "A", 4.0)  # reloaded: weight 4
    assert counters.get(team_key("A")) == 125.0


def test_in_a_cluster_heads_are_team_level_and_members_are_read_back() -> None:
    counters = JournaledCounters()
    policy = teams("vtc", counters)
    queue = TierQueue(policy, FifoOrdering(), counters)
    for user, team in (("a1", "A"), ("a2", "A"), ("solo", None)):
        t = ticket(user)
        t.team, t.team_weight = team, 2.0 if team else 1.0
        queue.push(t)
    _journal, read_back, heads, members = counters.take_journal()
    assert {u for u, _ in heads} == {team_key("A"), "solo"}
    prefix = team_key("A") + "\x1f"
    assert set(read_back) == {team_key("A"), "solo", prefix + "a1", prefix + "a2"}
    # Members have heads of their own, by team.
    assert {(g, n) for g, n, _ in members} == {(team_key("A"), prefix + u) for u in ("a1", "a2")}
    # A member is never lifted to a team-level floor from elsewhere.
    counters.adopt({}, PeerHeads(((team_key("B"), 500.0),)))
    t = ticket("a3")
    t.team, t.team_weight = "A", 2.0
    queue.push(t)
    assert counters.get(prefix + "a3") == 0.0
    assert queue.may_serve("a3") and queue.may_serve("solo")
    # Another replica's counters for a member reach the team's user level.
    counters.adopt({prefix + "a1": 50.0}, PeerHeads())
    members = [u for u in policy.candidates(1e9, 8) if u != "solo"]
    assert members == ["a2", "a3", "a1"]
    assert policy.level_key("solo") == "solo"


def test_tier_queue_charges_team_and_user_and_empties_cleanly() -> None:
    counters = LocalCounters()
    queue = TierQueue(teams("vtc", counters), FifoOrdering(), counters)
    served = []
    for user, team in (("a1", "A"), ("a1", "A"), ("a2", "A"), ("b1", "B"), ("b1", "B")):
        t = ticket(user, prompt="x" * 10)
        t.team, t.team_weight = team, 2.0 if team == "A" else 1.0
        queue.push(t)
    running = []
    while len(queue):
        running.append(queue.pop())
        served.append(running[-1].user)
    assert served == ["a1", "b1", "a2", "b1", "a1"]
    assert queue.active_users == 0
    # Nothing queued, but requests run: nobody is idle, the standing stays.
    assert counters._values != {}
    for t in running:
        t.stopped_running()
        t.stopped_running()  # once only
    assert len(queue.outstanding) == 0
    assert counters._values == {}  # one process, nobody backlogged or running: history goes


def test_in_a_cluster_a_member_waits_for_its_team_mates_further_behind_elsewhere() -> None:
    counters = JournaledCounters(slack=5.0)
    policy = teams("vtc", counters)
    queue = TierQueue(policy, FifoOrdering(), counters)
    for user, team in (("a1", "A"), ("b1", "B")):
        t = ticket(user)
        t.team, t.team_weight = team, 1.0
        queue.push(t)
    a, b = team_key("A"), team_key("B")
    a1 = a + "\x1fa1"
    counters.adopt({a1: 100.0}, PeerHeads())  # a1 already served here and elsewhere
    # A team mate elsewhere further behind than the slack: a1 waits; within it, a1 goes.
    counters.adopt({a1: 100.0}, PeerHeads(members=((a, a + "\x1fa2", 90.0),)))
    assert not queue.may_serve("a1")
    counters.adopt({a1: 100.0}, PeerHeads(members=((a, a + "\x1fa2", 95.0),)))
    assert queue.may_serve("a1")
    # Another team's members, and a1's own head elsewhere, are no floor for a1.
    others = ((b, b + "\x1fb2", 0.0), (a, a1, 0.0))
    counters.adopt({a1: 100.0}, PeerHeads(members=others))
    assert queue.may_serve("a1") and queue.may_serve("b1")
    # The member heads this replica stores: its smallest backlogged member of each team.
    _journal, _read, _heads, members = counters.take_journal()
    assert sorted(members) == [(a, a1, 100.0), (b, b + "\x1fb1", 0.0)]
    # a1's queue here empties: its head goes.
    queue.pop("a1")
    assert counters.take_journal()[3] == ((b, b + "\x1fb1", 0.0),)
