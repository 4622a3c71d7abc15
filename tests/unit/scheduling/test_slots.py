"""Deciding at the slot: shares of slots, anticipation of a caller's next request, lookahead.

Exact orders on a clock moved by hand, through the dispatcher with a recording launcher (see
``test_dispatcher.py``): a backend of four slots (``max_in_flight``), vtc. A closed-loop caller
ends a request and sends the next a moment later; the slot it freed waits for it if it runs
less than its share, and otherwise goes to the fair pick at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairq_server.config.schema import TierConfig
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.slot_share import Outstanding
from fairq_server.scheduling.ticket import Ticket, TicketState

from .test_dispatcher import Harness, settle

TIER = TierConfig("standard", max_backend_waiting=3)
BOUND = 0.05  # scheduler.anticipation_seconds (the default)


def harness(**config: object) -> Harness:
    return Harness(tiers=(TIER,), fairness="vtc", max_in_flight=4, **config)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as hh:
        yield hh


async def started(h: Harness) -> None:
    """Play the engine: every request sent gets its first token (it runs, not waits)."""
    while fresh := [t for t in h.running() if not t.generating]:
        for t in fresh:
            h.first_token(t)
        await settle()


async def ask(h: Harness, user: str, n: int = 1, max_tokens: int = 100) -> list[Ticket]:
    tickets = []
    for _ in range(n):
        t = h.ticket(user)
        t.max_tokens = max_tokens
        tickets.append(t)
    await h.submit(*tickets)
    await started(h)
    return tickets


def users(tickets: list[Ticket]) -> list[str]:
    return [t.user for t in tickets]


async def end(h: Harness, t: Ticket) -> None:
    h.release(t)
    await settle()
    await started(h)


async def tick(h: Harness, seconds: float) -> None:
    h.clock.now += seconds
    h.d.wake()
    await settle()
    await started(h)


# -- slot shares ---------------------------------------------------------------------------


def test_shares_are_the_weighted_equal_split_by_team_then_user() -> None:
    out = Outstanding()
    for user in ("r1", "r2"):
        out.add(user, 1.0, "red", 3.0)
    for user in ("b1", "b2", "b3"):
        out.add(user, 1.0, "blue", 1.0)
    assert out.owed("r1", 4) == pytest.approx((1.5, 3.0))
    assert out.owed("b1", 4) == pytest.approx((1 / 3, 1.0))
    out.started("b1")
    # Blue runs its one slot: no other blue user is below its share, though each runs none.
    assert not out.below("b2", 4)
    assert out.below("r1", 4)
    assert out.at_share("b2", 4)  # its team runs its one slot
    out.started("r1")
    out.started("r1")
    assert out.at_share("r1", 4)  # 2 >= 1.5
    assert not out.at_share("r2", 4)
    out.stopped("b1")
    assert out.below("b2", 4)
    assert out.owed("b1", 4) is None  # nothing outstanding any more
    assert out.owed("b2", 4) == pytest.approx((0.5, 1.0))


def test_a_finishing_request_no_longer_counts_against_its_user() -> None:
    out = Outstanding()
    out.add("s", 1.0, None, 1.0)
    out.add("s", 1.0, None, 1.0)
    out.add("l", 1.0, None, 1.0)
    out.started("s")
    out.started("s")
    assert out.at_share("s", 4) and not out.below("s", 4)
    out.finishing("s")
    assert out.below("s", 4)
    out.stopped("s", finishing=True)
    out.stopped("s")
    assert out.owed("s", 4) is None and len(out) == 1


# -- anticipation --------------------------------------------------------------------------


async def test_a_slot_freed_by_a_chat_caller_waits_for_its_next_request(h: Harness) -> None:
    chats = [(await ask(h, f"chat{i}"))[0] for i in (1, 2, 3)]
    await ask(h, "deep", 8, max_tokens=400)
    assert users(h.order) == ["chat1", "chat2", "chat3", "deep"]
    await end(h, chats[0])
    # Deep has seven queued; the slot is chat1's for a moment, not deep's.
    assert len(h.running()) == 3
    await tick(h, 0.003)
    await ask(h, "chat1")
    assert users(h.order)[-1] == "chat1" and len(h.running()) == 4
    assert h.d.anticipation.taken == 1 and h.d.anticipation.lapsed == 0


async def test_a_held_slot_goes_to_the_fair_pick_when_its_hold_lapses(h: Harness) -> None:
    chat = (await ask(h, "chat"))[0]
    await ask(h, "deep", 8, max_tokens=400)
    await end(h, chat)
    assert len(h.running()) == 3
    await tick(h, BOUND * 0.9)
    assert len(h.running()) == 3
    await tick(h, BOUND * 0.2)
    assert users(h.order)[-1] == "deep" and len(h.running()) == 4
    assert h.d.anticipation.lapsed == 1


async def test_a_caller_above_its_share_gets_no_hold(h: Harness) -> None:
    # Six chat callers on four slots: each is owed 2/3 of a slot; one that runs one is over.
    chats = [(await ask(h, f"c{i}"))[0] for i in range(6)]
    assert users(h.order) == ["c0", "c1", "c2", "c3"]
    await end(h, chats[0])
    assert users(h.order)[-1] in ("c4", "c5")  # at once: a queued caller below its share
    assert len(h.running()) == 4 and h.d.anticipation.held == 0


async def test_a_caller_slow_to_return_loses_its_holds(h: Harness) -> None:
    await ask(h, "deep", 8, max_tokens=400)
    for _ in range(3):
        chat = (await ask(h, "chat"))[0]
        while chat.state is not TicketState.RUNNING:
            await end(h, next(t for t in h.running() if t.user == "deep"))
        await end(h, chat)
        await tick(h, BOUND * 2)  # it thinks longer than the bound
    # Held once (no history yet); its gap then showed it thinks longer than the bound.
    assert (h.d.anticipation.held, h.d.anticipation.lapsed) == (1, 1)


async def test_a_higher_tier_is_not_held_back_by_a_lower_tiers_hold() -> None:
    tiers = (TierConfig("interactive", max_backend_waiting=3), TIER)
    async with Harness(tiers=tiers, fairness="vtc", max_in_flight=2) as h:
        chat = h.ticket("chat", tier=1)
        await h.submit(chat)
        await h.submit(*(h.ticket("deep", tier=1) for _ in range(3)))
        await started(h)
        await end(h, chat)
        assert users(h.running()) == ["deep"]  # the other slot is held for chat
        await h.submit(h.ticket("boss", tier=0))
        assert users(h.running()) == ["deep", "boss"]


# -- lookahead -----------------------------------------------------------------------------


async def test_a_slot_about_to_free_is_filled_ahead_of_its_end(h: Harness) -> None:
    first = await ask(h, "deep", 8, max_tokens=100)
    assert len(h.running()) == 4
    h.d.post(ev.Tokens(first[0], first[0].attempt, 80))
    await settle()
    assert len(h.running()) == 4  # 20 tokens left: not yet
    h.d.post(ev.Tokens(first[0], first[0].attempt, 5))
    await settle()
    await started(h)
    assert len(h.running()) == 5 and h.entries[0].finishing == 1
    await end(h, first[0])
    assert len(h.running()) == 4 and h.entries[0].finishing == 0


async def test_a_slot_to_be_held_is_not_filled_ahead(h: Harness) -> None:
    chat = (await ask(h, "chat"))[0]
    await ask(h, "deep", 8, max_tokens=400)
    h.d.post(ev.Tokens(chat, chat.attempt, 95))
    await settle()
    assert len(h.running()) == 4 and h.entries[0].finishing == 0


async def test_a_caller_over_its_share_gives_way_to_one_below() -> None:
    async with harness(anticipation_seconds=0.0) as h:
        both = [h.ticket(u) for u in ("long",) * 4 + ("short",) * 4]
        await h.submit(*both)
        await started(h)
        assert users(h.order) == ["long", "short", "long", "short"]
        short = [t for t in both if t.user == "short"]
        h.d.post(ev.Tokens(short[0], short[0].attempt, 40))  # short is charged ahead of long
        await end(h, short[0])
        # Long's counter is the lower, but it runs its share of two while short runs one:
        # short goes.
        assert users(h.order)[-1] == "short"
        assert h.d.anticipation.held == 0


# -- the bound -----------------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from(["a", "b", "c", "d", "e"]), st.integers(1, 3)),
        st.tuples(st.just("end"), st.integers(0, 7), st.just(0)),
        st.tuples(st.just("time"), st.sampled_from([0.001, 0.01, 0.03, 0.06]), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
async def test_no_slot_idles_longer_than_the_bound_while_a_request_waits(
    ops: list[tuple[str, object, object]],
) -> None:
    """After every step: if a request is queued and a slot is free, every free slot is held,
    by a hold younger than the bound; a step of time past the bound hands them on."""
    async with harness() as h:
        since: float | None = None  # since when a request waits beside a free slot
        for kind, a, b in ops:
            if kind == "ask":
                await ask(h, str(a), int(b))  # type: ignore[call-overload]
            elif kind == "end":
                running = h.running()
                if running:
                    await end(h, running[int(a) % len(running)])  # type: ignore[call-overload]
            else:
                await tick(h, float(a))  # type: ignore[arg-type]
            backend = h.entries[0]
            free = backend.max_in_flight - backend.in_flight + backend.finishing
            waiting = len(h.queue)
            if waiting and free > 0:
                since = h.clock.now if since is None else since
                holds = h.d.anticipation.live("m", h.clock.now)
                assert free <= len(holds), (free, holds)
                assert all(hold.until - h.clock.now <= BOUND + 1e-9 for hold in holds.values())
                assert h.clock.now - since <= BOUND + 1e-9
            else:
                since = None


def test_the_bound_is_the_configured_one() -> None:
    assert dataclasses.fields(harness().config)  # the harness builds a SchedulerConfig
    assert harness().config.anticipation_seconds == BOUND


async def test_a_team_mate_below_its_share_gets_the_slot_not_a_hold() -> None:
    """Teams 3:1 at two in flight each: red's three slots go round its two users.

    When red2's request ends, red1 (one running, one queued) is below its share once that
    slot is counted as ended; a hold for red2 kept red1 at one slot for good (0.74 of its
    owed share against red2's 1.19 on the simulator).
    """
    async with harness() as h:

        def of(user: str, team: str, weight: float) -> Ticket:
            t = h.ticket(user)
            t.team, t.team_weight, t.max_tokens = team, weight, 48
            return t

        red2 = [of("red2", "red", 3.0), of("red2", "red", 3.0)]
        await h.submit(*red2, of("blue1", "blue", 1.0))
        await started(h)
        await h.submit(of("red1", "red", 3.0), of("red1", "red", 3.0))
        await started(h)
        assert sorted(users(h.running())) == ["blue1", "red1", "red2", "red2"]
        await end(h, red2[0])
        assert sorted(users(h.running())) == ["blue1", "red1", "red1", "red2"]
        assert h.d.anticipation.held == 0
