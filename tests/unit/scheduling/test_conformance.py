"""One conformance suite per plugin protocol, run against every registered plugin.

A new fairness policy, ordering, gate or router is picked up here by its registry line alone:
these tests state the contract each protocol's docstring promises.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from fairq_server.backends.request import MetricsSample
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config.schema import TierConfig
from fairq_server.scheduling.backend_state import BackendState, Health
from fairq_server.scheduling.counters import JournaledCounters, LocalCounters, PeerHeads
from fairq_server.scheduling.interfaces import Cost, GateOutcome
from fairq_server.scheduling.prefix import PrefixCache, prefix_hashes
from fairq_server.scheduling.registry import (
    FAIRNESS_POLICIES,
    GATES,
    ORDERING_POLICIES,
    ROUTERS,
    make_fairness,
    make_gate,
    make_ordering,
    make_router,
)

from .helpers import ticket

TIERS = (
    TierConfig("interactive", max_backend_waiting=3),
    TierConfig("batch", max_backend_waiting=0),
)
NOW = 500.0
PREFIX = prefix_hashes("shared system prompt " * 40, None, 128)


def backend(name: str = "b", *, waiting: float = 0, fresh: bool = True) -> BackendState:
    state = BackendState(VllmBackend(name, "http://127.0.0.1:9", ["m"]), PrefixCache(64))
    state.sample = MetricsSample(waiting=waiting, running=0)
    state.sampled_at = NOW if fresh else NOW - 100
    state.health = Health.UP
    return state


# -- registries ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "kind"),
    [(make_fairness, "fairness policy"), (make_ordering, "ordering policy"),
     (make_gate, "gate"), (make_router, "router")],
)  # fmt: skip
def test_an_unknown_name_or_option_fails_naming_the_valid_ones(make: object, kind: str) -> None:
    assert callable(make)
    with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; valid: "):
        make("nope")
    registry = {"fairness policy": FAIRNESS_POLICIES, "ordering policy": ORDERING_POLICIES,
                "gate": GATES, "router": ROUTERS}[kind]  # fmt: skip
    name = sorted(registry)[0]
    with pytest.raises(ValueError, match="takes no option 'bogus'"):
        make(name, {"bogus": 1})


def test_registry_names_are_kebab_case() -> None:
    for name in itertools.chain(FAIRNESS_POLICIES, ORDERING_POLICIES, GATES, ROUTERS):
        assert name == name.lower() and " " not in name and "_" not in name, name


# -- fairness --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_fairness_serves_only_active_users_and_candidates_start_with_select(name: str) -> None:
    policy = make_fairness(name)
    for user in "abc":
        policy.activate(user, 1.0)
    policy.deactivate("b")
    for _ in range(20):
        chosen = policy.select()
        assert chosen in {"a", "c"}
        candidates = policy.candidates(1e9, 8)
        assert candidates[0] == chosen
        assert set(candidates) <= {"a", "c"} and len(candidates) == len(set(candidates))
        assert len(policy.candidates(1e9, 1)) == 1
        policy.charge(chosen, Cost(requests=1, prompt_tokens=10, completion_tokens=10))


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_fairness_alternates_between_equal_always_backlogged_users(name: str) -> None:
    policy = make_fairness(name)
    for user in "ab":
        policy.activate(user, 1.0)
    served = Counter()
    for _ in range(100):
        user = policy.select()
        served[user] += 1
        policy.charge(user, Cost(requests=1, prompt_tokens=50, completion_tokens=20))
    assert abs(served["a"] - served["b"]) <= 1, served


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_fairness_takes_charges_for_idle_and_unknown_users(name: str) -> None:
    """Tokens keep streaming after a user's queue emptied: charges may come at any time."""
    policy = make_fairness(name)
    policy.charge("ghost", Cost(completion_tokens=5))  # nobody active at all
    policy.activate("a", 2.0)
    policy.charge("ghost", Cost(completion_tokens=5), 3.0)
    policy.charge("a", Cost(prompt_tokens=-3))  # a settled estimate may be negative
    assert policy.select() == "a"


# -- ordering --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ORDERING_POLICIES))
def test_ordering_keys_are_stateless_and_comparable(name: str) -> None:
    policy = make_ordering(name)
    tickets = [ticket("u", prompt="x" * n, max_tokens=m) for n, m in [(5, 9), (50, 1), (1, 1)]]
    keys = [policy.key(t) for t in tickets]
    assert keys == [policy.key(t) for t in tickets]  # same answer every time
    assert all(isinstance(k, tuple) and all(isinstance(x, float) for x in k) for k in keys)
    sorted(keys)  # any two keys compare


# -- gates -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GATES))
@pytest.mark.parametrize("tier", TIERS, ids=[t.name for t in TIERS])
def test_gates_admit_a_fresh_idle_healthy_backend(name: str, tier: TierConfig) -> None:
    assert make_gate(name).check(backend(), tier, NOW, 2.0) is GateOutcome.ADMIT


@pytest.mark.parametrize("name", sorted(GATES))
@pytest.mark.parametrize("tier", TIERS, ids=[t.name for t in TIERS])
def test_gates_fail_closed(name: str, tier: TierConfig) -> None:
    gate = make_gate(name)
    never_scraped = backend()
    never_scraped.sample = None
    stale = backend(fresh=False)
    down, suspect = backend(), backend()
    down.health = Health.DOWN
    suspect.health = Health.SUSPECT
    draining = backend()
    draining.draining = True
    flooded = backend(waiting=1000)
    for state in (never_scraped, stale, down, suspect, draining, flooded):
        outcome = gate.check(state, tier, NOW, 2.0)
        assert isinstance(outcome, GateOutcome) and outcome is not GateOutcome.ADMIT


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_fairness_policies_keep_their_standing_in_the_counters_they_are_given(name: str) -> None:
    """What a cluster shares: the service each user got, in the tier's counters."""
    counters = LocalCounters()
    policy = make_fairness(name, counters=counters)
    policy.activate("a", 1.0)
    policy.activate("b", 1.0)
    served = policy.select()
    policy.charge(served, Cost(requests=1, prompt_tokens=10, completion_tokens=5))
    other = "b" if served == "a" else "a"
    assert (counters.get(served) or 0.0) > (counters.get(other) or 0.0)
    assert policy.select() == other


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_fairness_policies_bank_no_idle_time_against_users_backlogged_elsewhere(name: str) -> None:
    counters = JournaledCounters()
    policy = make_fairness(name, counters=counters)
    counters.adopt({}, PeerHeads((("elsewhere", 42.0),)))
    policy.activate("new", 1.0)
    assert counters.get("new") == 42.0


@pytest.mark.parametrize("name", sorted(FAIRNESS_POLICIES))
def test_counters_are_supplied_by_the_registry_never_an_option(name: str) -> None:
    with pytest.raises(ValueError, match="takes no option 'counters'"):
        make_fairness(name, {"counters": LocalCounters()})


# -- routers -----------------------------------------------------------------------------------


def _routers() -> list[str]:
    return sorted(ROUTERS)


def _router(name: str) -> object:
    return make_router(name, {"slack": 2} if name == "prefix-affinity" else {})


@pytest.mark.parametrize("name", _routers())
def test_routers_choose_a_candidate_deterministically(name: str) -> None:
    router = _router(name)
    states = [backend(f"b{i}", waiting=i % 2) for i in range(4)]
    states[2].prefixes.add(PREFIX)
    states[3].in_flight = 5
    t = ticket("u")
    t.prefix = PREFIX
    for candidates in (states, states[1:], states[:1], list(reversed(states))):
        route = router.route(t, candidates)  # type: ignore[attr-defined]
        assert route.backend in candidates
        assert route == router.route(t, candidates)  # type: ignore[attr-defined]
        assert 0 <= route.affinity <= len(PREFIX)
        assert route.affinity == route.backend.prefixes.match(PREFIX) or route.affinity == 0


@pytest.mark.parametrize("name", _routers())
def test_routers_spread_equal_work_over_equal_backends(name: str) -> None:
    """Without prefixes, repeated routing with the load counted keeps backends within the
    slack of each other."""
    router = _router(name)
    states = [backend(f"b{i}") for i in range(3)]
    for _ in range(30):
        chosen = router.route(ticket("u"), states).backend  # type: ignore[attr-defined]
        chosen.in_flight += 1
    loads = [s.in_flight for s in states]
    assert max(loads) - min(loads) <= 3, loads
