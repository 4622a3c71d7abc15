"""The dispatcher without sockets: gates per tier, caps, release, retry, aging, routing, grouping.

The dispatcher is driven by events only, as in production: the test plays the pollers (scrape
sent / landed), the stream readers (first token, end, failure) and the callers (submit,
cancel), with a clock it moves by hand. Attempts start through a recording launcher, so no
backend is ever contacted. Nothing here sleeps: the loop runs whenever the test yields to it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

import pytest

from fairq_server.backends.request import MetricsSample, StreamEnd
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config.schema import SchedulerConfig, TierConfig
from fairq_server.errors import (
    BackendError,
    BackendFailure,
    QueueFullError,
    SchedulerError,
    ShuttingDownError,
)
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.backend_state import BackendState, Health
from fairq_server.scheduling.dispatcher import DISPATCH_BATCH, Dispatcher
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.outbox import OutboxEvent, Queued
from fairq_server.scheduling.policies import Policies
from fairq_server.scheduling.prefix import prefix_hashes
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry

from .helpers import ticket

INTERACTIVE = TierConfig("interactive", max_backend_waiting=3)
BATCH = TierConfig("batch", max_backend_waiting=0)
TIERS = (INTERACTIVE, BATCH)
PREFIX = prefix_hashes("You are a helpful assistant. " * 20, None, 128)

# Polling, staleness and the queue TTL are off unless a test turns them on: the clock jumps.
CONFIG = SchedulerConfig(
    poll_interval_seconds=60.0, stale_after_seconds=1e9, queue_ttl_seconds=None
)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Handle:
    """A started attempt, as the launcher returned it."""

    cancelled: bool = False

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class Harness:
    """A dispatcher for model ``m`` over ``backends`` vLLM adapters, driven by hand."""

    def __init__(
        self,
        backends: int = 1,
        *,
        tiers: Sequence[TierConfig] = TIERS,
        fairness: str = "round-robin",
        max_in_flight: int = 0,
        **config: object,
    ) -> None:
        self.clock = Clock()
        self.telemetry = Telemetry()
        self.config = replace(CONFIG, fairness=fairness, **config)  # type: ignore[arg-type]
        self.tiers = tuple(tiers)
        self._backends = backends
        self._max_in_flight = max_in_flight
        self.entries: list[BackendState] = []
        self.order: list[Ticket] = []  # tickets in the order they were started on a backend
        self.assigned: dict[Ticket, BackendState] = {}
        self.handles: dict[Ticket, Handle] = {}
        self.d = Dispatcher(
            self.tiers,
            self.config,
            self.telemetry,
            Policies.from_config(self.config),
            launcher=self._launch,
            clock=self.clock,
        )

    def _launch(self, t: Ticket) -> Handle:
        assert t.backend is not None
        self.order.append(t)
        self.assigned[t] = t.backend
        self.handles[t] = handle = Handle()
        return handle

    async def __aenter__(self) -> Harness:
        self.d.start()
        for i in range(self._backends):
            # Never contacted: the launcher above stands in for the stream reader.
            backend = VllmBackend(
                f"b{i}", "http://127.0.0.1:9", ["m"], max_in_flight=self._max_in_flight
            )
            state = await self.d.add_backend(backend)
            self.entries.append(state)
            self.scrape(state)
        await settle()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.d.close()

    @property
    def queue(self) -> ModelQueue:
        return self.d.queue("m")

    def scrape(self, entry: BackendState | None = None, waiting: int = 0) -> None:
        """Play the poller: a scrape sent now, answered with ``waiting`` queued requests."""
        for e in [entry] if entry is not None else self.entries:
            self.d.scrape_sent(e.id)
            self.d.scrape_landed(e.id, MetricsSample(waiting=waiting, running=e.in_flight))

    def ticket(self, user: str, tier: int = 0, prefix: tuple[int, ...] = ()) -> Ticket:
        t = ticket(user, tier)
        t.arrival = self.clock.now
        t.prefix = prefix
        return t

    async def submit(self, *tickets: Ticket) -> None:
        for t in tickets:
            self.d.submit(t)
        await settle()

    def release(self, t: Ticket) -> None:
        """The request is over: the backend finished it if it runs, else the caller left."""
        if t.state is TicketState.RUNNING:
            self.d.post(ev.StreamEnded(t, t.attempt, StreamEnd("stop"), 0))
        else:
            self.d.cancel(t)

    def first_token(self, t: Ticket) -> None:
        self.d.post(ev.FirstToken(t, t.attempt, self.clock.now))

    def fail(self, t: Ticket, *, retryable: bool = True) -> None:
        error = BackendError("connection reset", BackendFailure.UNAVAILABLE, retryable=retryable)
        self.d.post(ev.StreamFailed(t, t.attempt, error))

    def running(self, entry: BackendState | None = None) -> list[Ticket]:
        return [
            t
            for t in self.order
            if t.state is TicketState.RUNNING and (entry is None or t.backend is entry)
        ]

    def refusals(self, backend: str, reason: str) -> float:
        value = self.telemetry.registry.get_sample_value(
            "fairq_gate_refusals_total", {"backend": backend, "reason": reason}
        )
        return value or 0.0


async def settle() -> None:
    """Let the dispatch loop apply everything posted so far (it never awaits I/O)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def outcome(t: Ticket) -> list[OutboxEvent]:
    """What the ticket's caller has been told so far (raises the error it was given)."""
    return await asyncio.wait_for(t.outbox.take(), 1.0)


async def error_of(t: Ticket) -> SchedulerError:
    """The error the ticket's caller gets, after any events before it."""
    try:
        while True:
            await outcome(t)
    except SchedulerError as exc:
        return exc


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with Harness() as harness:
        yield harness


# -- the gate per tier ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tier", "waiting", "admitted"),
    [(0, 0, 3), (0, 2, 1), (0, 3, 0), (1, 0, 1), (1, 1, 0)],
)
async def test_tier_threshold_bounds_what_is_forwarded(
    h: Harness, tier: int, waiting: int, admitted: int
) -> None:
    """Interactive fills the backend queue up to 3, batch only while it is empty."""
    h.scrape(waiting=waiting)
    tickets = [h.ticket(f"u{i}", tier) for i in range(5)]
    await h.submit(*tickets)
    assert len(h.order) == admitted
    assert len(h.queue) == 5 - admitted
    assert all(t.state is TicketState.QUEUED for t in tickets[admitted:])


async def test_lower_tiers_wait_while_the_highest_backlogged_tier_is_refused() -> None:
    # A misconfiguration where batch is looser than interactive shows that strictness comes
    # from the tier order, not from the gates happening to be nested.
    tiers = (TierConfig("interactive", max_backend_waiting=1), TierConfig("batch", 5))
    async with Harness(tiers=tiers) as h:
        h.scrape(waiting=2)
        batch, inter = h.ticket("b", 1), h.ticket("i", 0)
        await h.submit(batch, inter)
        assert h.order == []
        assert h.refusals("b0", "waiting") >= 1
        # Without the interactive request, batch goes through its own (looser) gate.
        h.release(inter)
        await settle()
        assert h.order == [batch]


async def test_missing_or_stale_metrics_hold_every_tier(h: Harness) -> None:
    h.entries[0].sample = None
    t = h.ticket("a")
    await h.submit(t)
    assert h.order == []
    assert h.refusals("b0", "no_metrics") >= 1
    h.scrape()
    await settle()
    assert h.order == [t]


async def test_stale_snapshot_holds_dispatch() -> None:
    async with Harness(stale_after_seconds=1.0) as h:
        h.clock.now += 1.5
        t = h.ticket("a")
        await h.submit(t)
        assert h.order == []
        assert h.refusals("b0", "stale") >= 1
        h.scrape()
        await settle()
        assert h.order == [t]


async def test_strict_tiers_interactive_first_then_batch_only_on_an_empty_backend(
    h: Harness,
) -> None:
    h.scrape(waiting=5)
    batch, inter = h.ticket("b", 1), h.ticket("i", 0)
    await h.submit(batch, inter)
    assert h.order == []
    h.scrape(waiting=0)
    await settle()
    # The interactive request goes; batch now sees one request it sent and has no token yet.
    assert h.order == [inter]
    h.first_token(inter)
    h.scrape(waiting=0)  # the backend reports it running, not waiting
    await settle()
    assert h.order == [inter, batch]


async def test_dispatch_stops_at_the_threshold_and_resumes_on_release_and_first_token(
    h: Harness,
) -> None:
    tickets = [h.ticket(f"u{i}") for i in range(8)]
    await h.submit(*tickets)
    assert h.order == tickets[:3]  # estimated waiting 0 + 3 unseen = 3
    # A finished request frees a place: 0 + 3 unseen - 1 finished = 2.
    h.release(tickets[0])
    await settle()
    assert h.order == tickets[:4]
    # A scrape that cannot see our requests yet still counts the 3 without a first token.
    h.scrape(waiting=0)
    await settle()
    assert len(h.order) == 4
    h.first_token(tickets[1])
    await settle()
    assert h.order == tickets[:5]
    h.first_token(tickets[1])  # a repeated report changes nothing
    await settle()
    assert len(h.order) == 5
    assert h.entries[0].in_flight == 4
    assert h.entries[0].awaiting_first_token == 3


# -- caps, release, close ------------------------------------------------------------------


async def test_a_large_admission_is_started_in_batches_with_the_loop_free_between() -> None:
    """When many slots open at once, other tasks run after every DISPATCH_BATCH starts."""
    wide = (TierConfig("interactive", max_backend_waiting=10_000),)
    async with Harness(tiers=wide) as h:
        h.scrape(waiting=10_000)  # closed while the tickets queue up
        count = 5 * DISPATCH_BATCH + 3
        await h.submit(*(h.ticket(f"u{i}") for i in range(count)))
        assert h.order == []
        seen: list[int] = []

        async def observer() -> None:
            while len(h.order) < count:
                seen.append(len(h.order))
                await asyncio.sleep(0)

        task = asyncio.create_task(observer())
        h.scrape(waiting=0)  # every slot opens at once
        await asyncio.wait_for(task, timeout=5)
    steps = sorted(set(seen) - {0})
    assert steps == [DISPATCH_BATCH * k for k in range(1, 6)], steps


async def test_queue_caps_reject_with_queue_full() -> None:
    async with Harness(max_queued_total=3, max_queued_per_user=2) as h:
        h.scrape(waiting=10)  # nothing leaves the queue
        a1, a2, a3, b1, c1 = (h.ticket(u) for u in "aaabc")
        await h.submit(a1, a2, a3, b1, c1)
        assert await outcome(a1) == [Queued(0)]
        assert await outcome(b1) == [Queued(1)]  # one turn of a's goes first
        with pytest.raises(QueueFullError, match="user 'a' already has 2 queued"):
            await outcome(a3)
        with pytest.raises(QueueFullError, match="queues are full"):
            await outcome(c1)
        assert a3.state is TicketState.DONE and c1.state is TicketState.DONE
        assert len(h.queue) == 3
        # A cancelled request frees its place under both caps.
        h.release(a1)
        a4 = h.ticket("a")
        await h.submit(a4)
        (queued,) = await outcome(a4)
        assert isinstance(queued, Queued)
        assert len(h.queue) == 3


async def test_released_queued_ticket_is_never_dispatched(h: Harness) -> None:
    h.scrape(waiting=10)
    t1, t2, t3 = h.ticket("a"), h.ticket("b"), h.ticket("c")
    await h.submit(t1, t2, t3)
    h.release(t2)
    # Submitted and cancelled before the loop even saw it.
    t4 = h.ticket("d")
    h.d.submit(t4)
    h.release(t4)
    await settle()
    h.scrape(waiting=0)
    await settle()
    assert h.order == [t1, t3]
    assert t2 not in h.assigned and t4 not in h.assigned
    assert t2.state is TicketState.DONE and t4.state is TicketState.DONE
    assert len(h.queue) == 0
    assert h.entries[0].in_flight == 2


async def test_release_of_a_running_ticket_frees_its_slot_once(h: Harness) -> None:
    t = h.ticket("a")
    await h.submit(t)
    load = h.entries[0]
    assert (load.in_flight, load.awaiting_first_token, load.dispatched) == (1, 1, 1)
    assert not h.entries[0].idle.is_set()
    h.release(t)
    h.release(t)  # a second release of a finalized ticket is a no-op
    await settle()
    assert (load.in_flight, load.awaiting_first_token, load.finished) == (0, 0, 1)
    assert h.entries[0].idle.is_set()
    assert t.state is TicketState.DONE


async def test_close_fails_queued_tickets_with_shutting_down(h: Harness) -> None:
    running = h.ticket("r")
    await h.submit(running)
    h.scrape(waiting=10)
    queued = [h.ticket(u, tier) for u, tier in [("a", 0), ("b", 1), ("a", 1)]]
    await h.submit(*queued)
    await h.d.close()
    for t in queued:
        assert isinstance(await error_of(t), ShuttingDownError)
        assert t.state is TicketState.DONE
    assert len(h.queue) == 0
    # Running requests are not evicted: they finish during the server's grace period.
    assert running.state is TicketState.RUNNING
    assert h.assigned.get(running) is h.entries[0]


async def test_commands_after_close_are_still_applied(h: Harness) -> None:
    """Regression: after close() the loop is gone, yet requests that were already being
    handled still post commands; a submit must fail at once (not hang until the server's
    grace period cancels it) and a running request's release must still free its slot."""
    running = h.ticket("r")
    await h.submit(running)
    await h.d.close()
    late = h.ticket("late")
    h.d.submit(late)
    assert isinstance(await error_of(late), ShuttingDownError)
    assert late.state is TicketState.DONE
    h.release(running)
    assert h.entries[0].in_flight == 0
    assert h.entries[0].idle.is_set()


# -- retry ---------------------------------------------------------------------------------


async def test_retry_goes_ahead_of_its_tier_and_prefers_another_backend() -> None:
    async with Harness(2) as h:
        x, y = h.entries
        r = h.ticket("r")
        await h.submit(r)
        assert h.assigned.get(r) is x  # equal load: the first registered
        h.scrape(waiting=10)
        others = [h.ticket(u) for u in "abc"]
        await h.submit(*others)
        # The stream reader saw x fail before a token, for a reason another backend may not.
        h.fail(r)
        await settle()
        assert r.state is TicketState.QUEUED
        assert (r.retries, r.excluded) == (1, frozenset({"b0"}))
        assert x.in_flight == 0 and x.finished == 1
        # x is suspect until its next scrape succeeds: nothing goes there meanwhile.
        assert not x.healthy
        # y can take exactly one request; x could take more and is less loaded, but failed.
        h.scrape(x, waiting=0)
        h.scrape(y, waiting=2)
        await settle()
        assert h.order[1] is r
        assert h.assigned.get(r) is y
        assert [h.assigned.get(t) for t in others] == [x, x, x]


async def test_retry_falls_back_to_the_failed_backend_when_it_is_the_only_one(
    h: Harness,
) -> None:
    r = h.ticket("r")
    await h.submit(r)
    h.scrape(waiting=10)
    other = h.ticket("o")
    await h.submit(other)
    h.fail(r)
    await settle()
    h.scrape(waiting=2)  # one place
    await settle()
    assert h.assigned.get(r) is h.entries[0]
    assert other.state is TicketState.QUEUED


async def test_retry_of_a_ticket_that_is_not_running_is_ignored(h: Harness) -> None:
    h.scrape(waiting=10)
    t = h.ticket("a")
    await h.submit(t)
    h.fail(t)
    await settle()
    assert t.retries == 0
    assert len(h.queue) == 1


# -- aging ---------------------------------------------------------------------------------


async def test_aging_lets_batch_overtake_once_per_interval_and_not_before() -> None:
    tiers = (INTERACTIVE, replace(BATCH, aging_seconds=10.0))
    async with Harness(tiers=tiers) as h:
        inter = [h.ticket(f"i{i}") for i in range(12)]
        b1, b2 = h.ticket("b", 1), h.ticket("b", 1)
        await h.submit(b1, b2, *inter)  # batch backlogged from t = 0
        assert h.order == inter[:3]

        async def finish_one_at(t: float) -> Ticket:
            """Let one running request finish at time t; return what was dispatched."""
            h.clock.now = 1000.0 + t
            h.scrape()  # keep the snapshot fresh, marks move on
            h.release(h.running()[0])
            before = len(h.order)
            await settle()
            assert len(h.order) == before + 1
            return h.order[-1]

        assert (await finish_one_at(9.9)).tier == 0
        # Due: batch goes under the interactive gate (its own would refuse: 2 are waiting),
        # and is sent with interactive's backend priority so later interactive work cannot
        # overtake it again inside a priority-scheduling backend.
        assert await finish_one_at(10.0) is b1
        assert b1.priority_tier == 0
        assert inter[0].priority_tier == 0
        assert (await finish_one_at(19.9)).tier == 0
        assert await finish_one_at(20.0) is b2
        assert (await finish_one_at(40.0)).tier == 0  # no batch left to age


async def test_without_aging_batch_waits_for_interactive_to_drain(h: Harness) -> None:
    inter = [h.ticket(f"i{i}") for i in range(4)]
    b = h.ticket("b", 1)
    await h.submit(b, *inter)
    for _ in range(3):
        h.clock.now += 1000.0
        h.release(h.running()[0])
        await settle()
    assert b not in h.order
    assert h.order == inter


# -- several backends: spread and prefix affinity -------------------------------------------


@pytest.mark.parametrize("prefix", [(), PREFIX], ids=["no-prefix", "shared-prefix"])
async def test_a_burst_spreads_across_backends_within_the_slack(prefix: tuple[int, ...]) -> None:
    """After n requests on k backends, none has more than ceil(n / k) + routing_slack, and
    loads differ by at most slack + 1 (a backend is eligible up to least + slack in flight)."""
    tiers = (TierConfig("interactive", max_backend_waiting=1000),)
    async with Harness(3, tiers=tiers, routing_slack=2) as h:
        for n in range(1, 31):
            await h.submit(h.ticket(f"u{n}", prefix=prefix))
            loads = [e.in_flight for e in h.entries]
            assert sum(loads) == n
            assert max(loads) <= math.ceil(n / 3) + 2, loads
            assert max(loads) - min(loads) <= 3, loads
        if not prefix:  # no affinity at all: plain least-loaded rotation
            assert [e.in_flight for e in h.entries] == [10, 10, 10]
            assert [h.assigned.get(t) for t in h.order[:3]] == h.entries


async def test_prefix_affinity_follows_the_backend_that_served_the_prefix_within_slack() -> None:
    tiers = (TierConfig("interactive", max_backend_waiting=1000),)
    async with Harness(2, tiers=tiers, routing_slack=2) as h:
        x, y = h.entries
        h.scrape(x, waiting=10_000)  # y takes the first request with the prefix
        first = h.ticket("a", prefix=PREFIX)
        await h.submit(first)
        assert h.assigned.get(first) is y
        h.release(first)
        h.scrape()
        fillers = [h.ticket(f"f{i}") for i in range(2)]
        h.scrape(x, waiting=10_000)
        await h.submit(*fillers)  # y: 2 in flight, x: 0
        h.scrape()
        assert [e.in_flight for e in (x, y)] == [0, 2]
        same = h.ticket("b", prefix=PREFIX)
        await h.submit(same)
        assert h.assigned.get(same) is y  # 2 in flight <= 0 + slack: affinity wins
        again = h.ticket("c", prefix=PREFIX)
        await h.submit(again)
        assert h.assigned.get(again) is x  # y at 3 > 0 + slack: load wins
        # A request sharing only part of the prefix still counts its matched blocks.
        partial = h.ticket("d", prefix=(*PREFIX[:2], 12345))
        assert x.prefixes.match(partial.prefix) == y.prefixes.match(partial.prefix) == 2
        await h.submit(partial)
        assert h.assigned.get(partial) is x  # equal match: least loaded


# -- prefix grouping within the quantum ----------------------------------------------------


async def remember_prefix(h: Harness, prefix: tuple[int, ...]) -> None:
    """Have the backend serve (and finish) one request with ``prefix`` for user 'seed'."""
    seed = h.ticket("seed", prefix=prefix)
    await h.submit(seed)
    assert h.assigned.get(seed) is h.entries[0]
    h.release(seed)
    await settle()
    h.order.clear()


async def serve_one_at_a_time(h: Harness, n: int) -> list[str]:
    """Open the gate for one request at a time; return the users in dispatch order."""
    users = []
    for _ in range(n):
        h.scrape(waiting=10)  # closed while the previous one finishes
        for t in h.running():
            h.release(t)
        await settle()
        before = len(h.order)
        h.scrape(waiting=2)  # one place under the interactive threshold of 3
        await settle()
        assert len(h.order) == before + 1
        users.append(h.order[-1].user)
    return users


@pytest.mark.parametrize(("quantum", "first"), [(0.0, "a"), (10.0, "c")])
async def test_grouping_prefers_a_within_q_user_with_a_remembered_prefix(
    quantum: float, first: str
) -> None:
    async with Harness(fairness="vtc", prefix_quantum=quantum) as h:
        await remember_prefix(h, PREFIX)
        h.scrape(waiting=10)
        await h.submit(h.ticket("a"), h.ticket("b"), h.ticket("c", prefix=PREFIX))
        assert (await serve_one_at_a_time(h, 1)) == [first]


async def test_grouping_never_picks_a_user_beyond_q() -> None:
    async with Harness(fairness="vtc", prefix_quantum=10.0) as h:
        await remember_prefix(h, PREFIX)
        h.scrape(waiting=10)
        a, c = h.ticket("a"), h.ticket("c", prefix=PREFIX)
        await h.submit(a, c)
        h.queue.tiers[0].fairness.charge("c", Cost(prompt_tokens=11))  # 11 above a: beyond Q
        await settle()
        assert (await serve_one_at_a_time(h, 2)) == ["a", "c"]


async def test_q_zero_keeps_pure_fairness_order() -> None:
    async with Harness(prefix_quantum=0.0) as h:
        await remember_prefix(h, PREFIX)
        h.scrape(waiting=10)
        for user, prefix in [("a", ()), ("b", PREFIX), ("c", ()), ("a", PREFIX), ("b", ())]:
            await h.submit(h.ticket(user, prefix=prefix))
        assert await serve_one_at_a_time(h, 5) == ["a", "b", "c", "a", "b"]


async def test_grouping_lets_a_prefix_user_run_ahead_by_at_most_q() -> None:
    # Round-robin counters count requests: with Q = 1, c may be served while its counter is
    # at most the minimum + 1, i.e. twice before a and b have had a turn, and no more.
    async with Harness(prefix_quantum=1.0) as h:
        await remember_prefix(h, PREFIX)
        h.scrape(waiting=10)
        plan = [("a", ()), ("b", ()), ("c", PREFIX), ("a", ()), ("c", PREFIX), ("c", PREFIX)]
        for user, prefix in plan:
            await h.submit(h.ticket(user, prefix=prefix))
        assert await serve_one_at_a_time(h, 6) == ["c", "c", "a", "b", "c", "a"]


# -- supervision ---------------------------------------------------------------------------


async def test_a_crash_in_the_loop_fails_queued_requests_reports_and_restarts() -> None:
    health: list[bool] = []
    restarted = asyncio.Event()

    def on_health(serving: bool) -> None:
        health.append(serving)
        if serving:
            restarted.set()

    async with Harness() as h:
        h.d._on_health = on_health
        h.d.restart_delays = (0.0,)  # the delays are supervise's (test_supervisor_stop.py)
        h.scrape(waiting=10)  # everything stays queued
        running, queued = h.ticket("r"), [h.ticket(u) for u in "ab"]
        h.scrape(waiting=0)
        await h.submit(running)
        h.scrape(waiting=10)
        await h.submit(*queued)
        assert running.state is TicketState.RUNNING and len(h.queue) == 2

        real = h.d._picker.dispatch
        faults = iter([RuntimeError("injected")])

        def faulty(now: float, batch: int) -> bool:
            for fault in faults:
                raise fault
            return real(now, batch)

        h.d._picker.dispatch = faulty  # type: ignore[method-assign]
        h.scrape()  # wakes the loop into the fault
        for t in queued:
            error = await error_of(t)
            assert type(error).__name__ == "InternalError" and str(error) == "internal error"
        async with asyncio.timeout(5):
            await restarted.wait()
        assert health == [False, True] and h.d.crashes == 1
        # Running requests were not touched, and the restarted loop dispatches again.
        assert running.state is TicketState.RUNNING
        after = h.ticket("c")
        h.scrape(waiting=0)
        await h.submit(after)
        assert h.assigned.get(after) is h.entries[0]


async def test_a_fault_applying_one_event_fails_only_that_request(h: Harness) -> None:
    bad, good = h.ticket("bad"), h.ticket("good")
    bad.request = None  # type: ignore[assignment]  # breaks _submit for this ticket only
    await h.submit(bad, good)
    assert type(await error_of(bad)).__name__ == "InternalError"
    assert h.assigned.get(good) is h.entries[0]
    assert h.d.crashes == 0


async def test_a_failed_request_makes_its_backend_suspect_not_down(h: Harness) -> None:
    """One request that could not reach the backend holds new work there until the next good
    scrape, but the model still accepts requests: only failing scrapes make it down."""
    r = h.ticket("r")
    await h.submit(r)
    h.fail(r)
    await settle()
    backend = h.entries[0]
    assert backend.health is Health.SUSPECT and backend.serving
    late = h.ticket("late")
    await h.submit(late)
    (queued,) = await outcome(late)  # accepted
    assert isinstance(queued, Queued)
    assert late.state is TicketState.QUEUED and h.refusals("b0", "unhealthy") == 1
    h.scrape()
    await settle()
    assert backend.health is Health.UP
    assert h.assigned.get(r) is backend and h.assigned.get(late) is backend
    for _ in range(2):
        h.d.scrape_landed("b0", BackendError("timeout", BackendFailure.UNAVAILABLE))
    await settle()
    assert backend.health is Health.DOWN and not backend.serving
    refused = h.ticket("refused")
    await h.submit(refused)
    assert "no healthy backend" in str(await error_of(refused))
