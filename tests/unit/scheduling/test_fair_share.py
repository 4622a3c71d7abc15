"""Fair-share backend priority: the encoding, the boost rule, the cap, and the dispatcher's use.

The encoding and the rule are pure functions, checked as properties (hypothesis). The
dispatcher is driven by hand as in ``test_dispatcher.py``: a power user keeps the backend's
queue full, then light users arrive.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairq_server.backends.openai import OpenAIBackend
from fairq_server.backends.request import BackendRequest, Sampling
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config.loader import parse_config
from fairq_server.config.schema import ConfigError, TierConfig
from fairq_server.scheduling import fair_share
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.ticket import Ticket, TicketState

from .test_dispatcher import Harness, settle

ints = st.integers(min_value=-10_000, max_value=10_000)


# -- the encoding ----------------------------------------------------------------------------


@given(p=ints, q=ints, boost_p=st.booleans(), boost_q=st.booleans())
def test_no_boost_crosses_a_tier_boundary(p: int, q: int, boost_p: bool, boost_q: bool) -> None:
    """Lower tier priority first whatever the boosts; inside a tier, boosted first."""
    a, b = fair_share.encode(p, boost_p), fair_share.encode(q, boost_q)
    if p < q:
        assert a < b
    elif p == q:
        assert (a < b) == (boost_p and not boost_q)
        assert (a == b) == (boost_p == boost_q)


@given(p=ints, q=ints, boost_p=st.booleans(), boost_q=st.booleans())
def test_higher_first_backends_keep_both_orders(
    p: int, q: int, boost_p: bool, boost_q: bool
) -> None:
    """The ``openai`` kind negates the value for SGLang's higher-first order."""
    backend = OpenAIBackend(
        "s", "http://127.0.0.1:9", ["m"], priority_scheduling=True, priority_order="higher-first"
    )
    request = BackendRequest(model="m", prompt="x", sampling=Sampling(max_tokens=1))

    def sent(value: int) -> Any:
        return backend.payload(request, value)[1]["priority"]

    a, b = sent(fair_share.encode(p, boost_p)), sent(fair_share.encode(q, boost_q))
    if p < q or (p == q and boost_p and not boost_q):
        assert a > b  # served first by a higher-first backend


# -- the boost rule --------------------------------------------------------------------------


@given(users=st.integers(1, 50), each=st.integers(0, 50))
def test_equal_shares_are_never_boosted(users: int, each: int) -> None:
    """Every user holding the same share: one more request of any of them is not boosted."""
    assert not fair_share.below_share(each, users * each, users)


@given(own=st.integers(0, 100), others=st.integers(0, 1000), users=st.integers(1, 50))
def test_boost_needs_the_margin_and_holding_more_never_helps(
    own: int, others: int, users: int
) -> None:
    in_flight = own + others
    boosted = fair_share.below_share(own, in_flight, users)
    assert boosted == (own + 1 + fair_share.MARGIN <= (in_flight + 1) / users)
    if boosted and own:
        assert fair_share.below_share(own - 1, in_flight - 1, users)


@pytest.mark.parametrize(
    ("own", "in_flight", "users", "boosted"),
    [
        (0, 0, 1, False),  # alone on the backend: nobody to be unfair to
        (5, 5, 1, False),
        (0, 1, 2, False),  # one other request: an equal share is 1, no margin left
        (0, 3, 2, True),  # a light user against one power user holding 3
        (0, 7, 4, True),  # ... against three power users holding 7
        (0, 6, 4, False),  # 7 / 4 < 2: too close to an equal share
        (2, 6, 2, False),  # 3 vs 4 requests: the margin keeps near-equals in order
        (1, 9, 2, True),  # 2 vs 8
    ],
)
def test_boost_rule_examples(own: int, in_flight: int, users: int, boosted: bool) -> None:
    assert fair_share.below_share(own, in_flight, users) is boosted


# -- in the dispatcher -----------------------------------------------------------------------


class FairShareHarness(Harness):
    """One vLLM backend registered with priority scheduling and, by default, fair share."""

    def __init__(self, *, fair_share_priority: bool = True, **kw: Any) -> None:
        super().__init__(backends=0, **kw)
        self._fair = fair_share_priority

    async def __aenter__(self) -> FairShareHarness:
        await super().__aenter__()
        backend = VllmBackend(
            "b0",
            "http://127.0.0.1:9",
            ["m"],
            priority_scheduling=True,
            fair_share_priority=self._fair,
        )
        state = await self.d.add_backend(backend)
        self.entries.append(state)
        self.scrape(state)
        await settle()
        return self

    @property
    def b0(self) -> BackendState:
        return self.entries[0]

    async def flood(self, user: str, n: int, running: int) -> list[Ticket]:
        """``user`` submits ``n``; the first ``running`` dispatched get a token (they run).

        Afterwards the backend holds ``running`` of them running and 3 waiting (the gate).
        """
        tickets = [self.ticket(user) for _ in range(n)]
        await self.submit(*tickets)
        while sum(t.generating for t in tickets) < running:
            waiting = [t for t in self.running() if not t.generating]
            for t in waiting[: running - sum(t.generating for t in tickets)]:
                self.first_token(t)
            await settle()
        return tickets

    def boosts(self) -> float:
        value = self.telemetry.registry.get_sample_value(
            "fairq_fair_share_boosts_total", {"backend": "b0"}
        )
        return value or 0.0


async def test_a_light_user_is_boosted_past_a_full_backend_queue() -> None:
    async with FairShareHarness() as h:
        power = await h.flood("power", 20, running=4)
        assert h.b0.in_flight == 7 and h.b0.awaiting_first_token == 3
        assert {t.priority for t in h.running()} == {fair_share.encode(0, False)}
        light = h.ticket("light")
        await h.submit(light)
        # The gate is shut by the full queue, yet the light request goes at once, ahead.
        assert light.state is TicketState.RUNNING and light.boosted
        assert light.priority == fair_share.encode(0, True) < power[0].priority
        assert h.b0.boosted_in_flight == 1 and h.boosts() == 1
        assert sum(t.state is TicketState.QUEUED for t in power) == 13  # power waits as before
        h.release(light)
        await settle()
        assert h.b0.boosted_in_flight == 0 and "light" not in h.b0.user_in_flight


async def test_boosted_requests_in_flight_are_capped() -> None:
    async with FairShareHarness() as h:
        await h.flood("power", 30, running=4)
        lights = [h.ticket(f"light-{i}") for i in range(fair_share.MAX_BOOSTED + 1)]
        await h.submit(*lights)
        *boosted, held = lights
        assert all(t.state is TicketState.RUNNING and t.boosted for t in boosted)
        assert held.state is TicketState.QUEUED  # the cap is reached; the queue is full
        h.release(boosted[0])
        await settle()
        assert held.state is TicketState.RUNNING and held.boosted
        assert h.b0.boosted_in_flight == fair_share.MAX_BOOSTED


async def test_backlogged_users_with_equal_shares_are_not_boosted() -> None:
    async with FairShareHarness() as h:
        a = [h.ticket("a") for _ in range(10)]
        b = [h.ticket("b") for _ in range(10)]
        await h.submit(*a, *b)
        for _ in range(6):  # requests start and finish; round-robin keeps the shares equal
            for t in h.running():
                h.first_token(t)
            await settle()
            h.release(h.running()[0])
            await settle()
        assert len(h.order) > 8
        assert not any(t.boosted for t in h.order)
        assert h.boosts() == 0


async def test_tiers_dominate_boosts() -> None:
    """A boosted batch request is still sent behind every interactive one."""
    tiers = (TierConfig("interactive", 3), TierConfig("batch", 3, priority=5))
    async with FairShareHarness(tiers=tiers) as h:
        await h.flood("power", 8, running=4)
        light = h.ticket("light", tier=1)
        h.scrape(waiting=0)
        for t in h.running():
            h.first_token(t)
        await settle()
        h.release(h.running()[0])
        await h.submit(light)
        assert light.state is TicketState.RUNNING and light.boosted
        interactive = [t for t in h.order if t.tier == 0]
        assert light.priority == fair_share.encode(5, True)
        assert all(t.priority < light.priority for t in interactive)


async def test_off_by_default_sends_the_tier_priority() -> None:
    async with FairShareHarness(fair_share_priority=False) as h:
        power = await h.flood("power", 20, running=4)
        light = h.ticket("light")
        await h.submit(light)
        assert light.state is TicketState.QUEUED  # no bypass of the full queue
        for _ in range(3):  # slots free up one by one: light's round-robin turn comes
            h.first_token(next(t for t in h.running() if not t.generating))
            await settle()
            if light.state is TicketState.RUNNING:
                break
        assert light.state is TicketState.RUNNING and not light.boosted
        assert light.priority == power[0].priority == 0
        assert h.b0.boosted_in_flight == 0 and h.boosts() == 0


# -- configuration ---------------------------------------------------------------------------


def _raw(**backend: object) -> dict[str, Any]:
    return {
        "backends": [
            {"id": "v", "kind": "vllm", "base_url": "http://127.0.0.1:8000", "models": ["m"]}
            | backend
        ]
    }


def test_fair_share_priority_is_a_backend_switch_off_by_default() -> None:
    assert not parse_config(_raw()).backends[0].fair_share_priority
    cfg = parse_config(_raw(priority_scheduling=True, fair_share_priority=True))
    assert cfg.backends[0].fair_share_priority
    backend = VllmBackend.from_config(cfg.backends[0], timeout=1.0)
    assert backend.fair_share_priority and backend.priority_scheduling


def test_fair_share_priority_needs_priority_scheduling() -> None:
    with pytest.raises(ConfigError, match="fair_share_priority needs priority_scheduling"):
        parse_config(_raw(fair_share_priority=True))
