"""Unit tests of the benchmark scenarios' building blocks (fast; part of `make test`)."""

from __future__ import annotations

import itertools
import random

import pytest

from fairq_bench.scenarios import SCENARIOS, TITLES
from fairq_bench.scenarios.common import FairqSetup, SimSetup, Tier
from fairq_bench.scenarios.service import Ledger, jain, water_fill
from fairq_bench.scenarios.tracing import Trace
from fairq_bench.scenarios.workloads import CHAT, arrivals, prompt_text
from fairq_bench.workload import RequestSpec
from fairq_server.config.loader import parse_config
from fairq_server.scheduling.fairness import VtcFairness
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.registry import make_fairness
from fairq_sim.tokens import count_tokens


def test_jain_bounds() -> None:
    assert jain([1, 1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def test_water_fill_gives_small_demands_in_full() -> None:
    shares = water_fill({"a": 1.0, "b": 10.0, "c": 10.0}, 9.0)
    assert shares == pytest.approx({"a": 1.0, "b": 4.0, "c": 4.0})


def test_prompt_text_has_exact_simulator_length() -> None:
    for n in (2, 17, 256, 2050):
        assert count_tokens(prompt_text(n, "tag")) == n
    system = prompt_text(100, "system")
    assert prompt_text(150, "q1", prefix=system).startswith(system)


def test_arrivals_are_seeded_and_bursty_ones_vary_more() -> None:
    a = arrivals(random.Random(1), 5.0, 0.0, 200.0)
    assert a == arrivals(random.Random(1), 5.0, 0.0, 200.0)
    assert 800 < len(a) < 1200

    def cv(times: list[float]) -> float:
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = sum(gaps) / len(gaps)
        return (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean

    assert cv(arrivals(random.Random(2), 5.0, 0.0, 400.0, cv=2.0)) > 1.5 * cv(a)


def test_chat_lengths_have_published_medians() -> None:
    rng = random.Random(3)
    draws = sorted(CHAT.draw(rng) for _ in range(4001))
    prompts = sorted(p for p, _ in draws)
    outputs = sorted(o for _, o in draws)
    assert 90 < prompts[2000] < 130
    assert 210 < outputs[2000] < 290


def _trace(user: str, first: float, done: float, tokens: int, chunks: int) -> Trace:
    spec = RequestSpec(user, prompt_text(11, user), tokens)
    points = [
        (first + (done - first) * k / chunks, 4 * tokens * k // chunks)
        for k in range(1, chunks + 1)
    ]
    return Trace(spec, sent=0.0, first=first, done=done, points=points)


def test_ledger_counts_prompt_plus_twice_output() -> None:
    ledger = Ledger([_trace("a", 1.0, 2.0, 10, 5), _trace("b", 1.0, 3.0, 10, 2)])
    assert ledger.served("a", 5.0) == pytest.approx(11 + 2 * 10)
    assert ledger.served("b", 2.0) == pytest.approx(11 + 2 * 5)
    assert ledger.shares(0.0, 5.0)["a"] == pytest.approx(0.5)


def test_fairq_setup_renders_a_valid_config() -> None:
    import tomllib

    setup = FairqSetup(
        "vtc",
        (Tier("interactive", 3, 0.15), Tier("batch", 0, None, aging=20.0)),
        weights={"x": 2.0},
        scheduler={"prefix_quantum": "100"},
        backend={"priority_scheduling": "true"},
    )
    config = parse_config(tomllib.loads(setup.toml("http://127.0.0.1:1", speed=4.0)))
    assert config.scheduler.fairness == "vtc"
    assert config.tiers[0].tpot_limit_seconds == pytest.approx(0.15 / 4)
    assert config.tiers[1].aging_seconds == pytest.approx(5.0)
    assert config.keys[0].weight == 2.0
    assert config.backends[0].priority_scheduling


def test_capacity_estimate_matches_the_step_model() -> None:
    sim = SimSetup("llama-8b-gpu", max_num_seqs=11)
    assert 2.7 < sim.capacity(256, 256) < 3.1


def test_no_lift_baseline_banks_idle_time_where_vtc_does_not() -> None:
    for policy, expected in ((make_fairness("vtc", {"lift": False}), 0), (VtcFairness(), 1)):
        policy.activate("a", 1.0)
        policy.activate("b", 1.0)
        policy.charge("b", Cost(prompt_tokens=100, completion_tokens=0))
        policy.deactivate("b")
        for _ in range(5):
            policy.select()
            policy.charge("a", Cost(prompt_tokens=1000, completion_tokens=0))
        policy.activate("b", 1.0)
        # Both pick b first (its counter is no higher); only the baseline keeps picking it.
        picks = []
        for _ in range(3):
            user = policy.select()
            picks.append(user)
            policy.charge(user, Cost(prompt_tokens=500, completion_tokens=0))
        assert picks[0] == "b" and picks.count("a") == expected, (type(policy).__name__, picks)


def test_every_scenario_has_a_title() -> None:
    assert set(SCENARIOS) == set(TITLES)
