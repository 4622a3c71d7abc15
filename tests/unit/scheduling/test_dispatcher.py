"""The dispatcher without gRPC: gates per tier, caps, release, retry, aging, routing, grouping.

Backends are real :class:`VllmBackend` adapters registered in a real :class:`BackendPool`; their
``/metrics`` is served by a loopback server for the first scrape, then the poller is stopped
and each test writes the backend's snapshot itself (as the poller would), stamped with an
injected clock. Nothing here sleeps: the loop runs whenever the test yields to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest

from fairq_server.backends.registry import BackendEntry, BackendPool
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config import SchedulerConfig, TierConfig
from fairq_server.errors import QueueFullError, ShuttingDownError
from fairq_server.scheduling.dispatcher import DISPATCH_BATCH, Dispatcher
from fairq_server.scheduling.gate import MetricsSnapshot
from fairq_server.scheduling.prefix import prefix_hashes
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.registry import make_fairness, make_ordering
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry

from ...scripted_http import reply, serve
from .helpers import ticket

INTERACTIVE = TierConfig("interactive", max_backend_waiting=3)
BATCH = TierConfig("batch", max_backend_waiting=0)
TIERS = (INTERACTIVE, BATCH)
PREFIX = prefix_hashes("You are a helpful assistant. " * 20, None, 128)

# Polling, staleness and the queue TTL are off unless a test turns them on: the clock jumps.
CONFIG = SchedulerConfig(
    poll_interval_seconds=60.0, stale_after_seconds=1e9, queue_ttl_seconds=None
)


def metrics_text(waiting: int = 0, running: int = 0) -> str:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
    )


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    """A dispatcher for model ``m`` over ``backends`` vLLM adapters, driven by hand."""

    def __init__(
        self,
        backends: int = 1,
        *,
        tiers: Sequence[TierConfig] = TIERS,
        fairness: str = "round-robin",
        **config: object,
    ) -> None:
        self.clock = Clock()
        self.telemetry = Telemetry()
        self.config = replace(CONFIG, **config)  # type: ignore[arg-type]
        self.tiers = tuple(tiers)
        self._fairness = fairness
        self._backends = backends
        self.pool = BackendPool(poll_interval=60.0, on_update=lambda poller: None)
        self.entries: list[BackendEntry] = []
        self.order: list[Ticket] = []  # tickets in the order they were assigned a backend
        self._servers = contextlib.AsyncExitStack()  # each backend's /metrics server
        queue = ModelQueue(
            len(self.tiers), lambda: make_fairness(fairness), make_ordering(self.config.ordering)
        )
        self.d = Dispatcher(
            "m", queue, self.tiers, self.pool, self.config, self.telemetry, clock=self.clock
        )

    async def __aenter__(self) -> Harness:
        for i in range(self._backends):
            url = await self._servers.enter_async_context(
                serve(lambda request: reply(text=metrics_text()))
            )
            entry = await self.pool.add(VllmBackend(f"b{i}", url, ["m"]))
            # From now on the test plays the poller.
            assert entry.task is not None
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
            self.entries.append(entry)
            self.scrape(entry)
        self.d.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.d.close()
        await self.pool.close()
        # pool.close() leaves a backend with requests in flight to a task that closes it when
        # they end, and cancels that task before it has run: close every client here, before
        # its server goes.
        for entry in self.entries:
            await entry.backend.aclose()
        await self._servers.aclose()

    def scrape(self, entry: BackendEntry | None = None, waiting: int = 0) -> None:
        """Publish a fresh snapshot as the poller would: scraped waiting, marks as of now."""
        for e in [entry] if entry is not None else self.entries:
            load = e.load
            load.snapshot = MetricsSnapshot(
                taken_at=self.clock.now,
                waiting=waiting,
                running=load.in_flight,
                awaiting_mark=load.awaiting_first_token,
            )
            load.healthy = True  # a successful scrape clears a suspected failure
        self.d.wake()

    def ticket(self, user: str, tier: int = 0, prefix: tuple[int, ...] = ()) -> Ticket:
        t = ticket(user, tier)
        t.arrival = self.clock.now
        t.prefix = prefix
        t.assigned.add_done_callback(lambda f, t=t: self.order.append(t))
        return t

    async def submit(self, *tickets: Ticket) -> None:
        for t in tickets:
            self.d.submit(t)
        await settle()

    def running(self, entry: BackendEntry | None = None) -> list[Ticket]:
        return [
            t
            for t in self.order
            if t.state is TicketState.RUNNING and (entry is None or t.entry is entry)
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


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with Harness() as harness:
        yield harness


def assigned(t: Ticket) -> BackendEntry | None:
    return t.assigned.result() if t.assigned.done() else None


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
    assert len(h.d.queue) == 5 - admitted
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
        h.d.release(inter)
        await settle()
        assert h.order == [batch]


async def test_missing_or_stale_metrics_hold_every_tier(h: Harness) -> None:
    h.entries[0].load.snapshot = None
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
    h.d.first_token(inter)
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
    h.d.release(tickets[0])
    await settle()
    assert h.order == tickets[:4]
    # A scrape that cannot see our requests yet still counts the 3 without a first token.
    h.scrape(waiting=0)
    await settle()
    assert len(h.order) == 4
    h.d.first_token(tickets[1])
    await settle()
    assert h.order == tickets[:5]
    h.d.first_token(tickets[1])  # a repeated report changes nothing
    await settle()
    assert len(h.order) == 5
    assert h.entries[0].load.in_flight == 4
    assert h.entries[0].load.awaiting_first_token == 3


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
        assert a1.enqueued.result() == 0
        assert b1.enqueued.done() and not b1.enqueued.exception()
        with pytest.raises(QueueFullError, match="user 'a' already has 2 queued"):
            a3.enqueued.result()
        with pytest.raises(QueueFullError, match="queue for model 'm' is full"):
            c1.enqueued.result()
        with pytest.raises(QueueFullError):
            c1.assigned.result()
        assert a3.state is TicketState.DONE and c1.state is TicketState.DONE
        assert len(h.d.queue) == 3
        # A cancelled request frees its place under both caps.
        h.d.release(a1)
        a4 = h.ticket("a")
        await h.submit(a4)
        assert a4.enqueued.exception() is None
        assert len(h.d.queue) == 3


async def test_released_queued_ticket_is_never_dispatched(h: Harness) -> None:
    h.scrape(waiting=10)
    t1, t2, t3 = h.ticket("a"), h.ticket("b"), h.ticket("c")
    await h.submit(t1, t2, t3)
    h.d.release(t2)
    # Submitted and cancelled before the loop even saw it.
    t4 = h.ticket("d")
    h.d.submit(t4)
    h.d.release(t4)
    await settle()
    h.scrape(waiting=0)
    await settle()
    assert h.order == [t1, t3]
    assert not t2.assigned.done() and not t4.assigned.done()
    assert t2.state is TicketState.DONE and t4.state is TicketState.DONE
    assert len(h.d.queue) == 0
    assert h.entries[0].load.in_flight == 2


async def test_release_of_a_running_ticket_frees_its_slot_once(h: Harness) -> None:
    t = h.ticket("a")
    await h.submit(t)
    load = h.entries[0].load
    assert (load.in_flight, load.awaiting_first_token, load.dispatched) == (1, 1, 1)
    assert not h.entries[0].idle.is_set()
    h.d.release(t)
    h.d.release(t)  # a second release of a finalized ticket is a no-op
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
        assert t.enqueued.done() and t.enqueued.exception() is None
        with pytest.raises(ShuttingDownError):
            t.assigned.result()
        assert t.state is TicketState.DONE
    assert len(h.d.queue) == 0
    # Running requests are not evicted: they finish during the server's grace period.
    assert running.state is TicketState.RUNNING
    assert assigned(running) is h.entries[0]


async def test_commands_after_close_are_still_applied(h: Harness) -> None:
    """Regression: after close() the loop is gone, yet requests that were already being
    handled still post commands; a submit must fail at once (not hang until the server's
    grace period cancels it) and a running request's release must still free its slot."""
    running = h.ticket("r")
    await h.submit(running)
    await h.d.close()
    late = h.ticket("late")
    h.d.submit(late)
    with pytest.raises(ShuttingDownError):
        await asyncio.wait_for(late.enqueued, 1.0)
    assert late.state is TicketState.DONE
    h.d.release(running)
    assert h.entries[0].load.in_flight == 0
    assert h.entries[0].idle.is_set()


# -- retry ---------------------------------------------------------------------------------


async def test_retry_goes_ahead_of_its_tier_and_prefers_another_backend() -> None:
    async with Harness(2) as h:
        x, y = h.entries
        r = h.ticket("r")
        await h.submit(r)
        assert assigned(r) is x  # equal load: the first registered
        h.scrape(waiting=10)
        others = [h.ticket(u) for u in "abc"]
        await h.submit(*others)
        # The servicer saw x fail before a token and asks for a retry with a fresh future.
        r.assigned = asyncio.get_running_loop().create_future()
        r.assigned.add_done_callback(lambda f: h.order.append(r))
        h.d.retry(r)
        await settle()
        assert r.state is TicketState.QUEUED
        assert (r.retries, r.excluded) == (1, frozenset({"b0"}))
        assert x.load.in_flight == 0 and x.load.finished == 1
        # x is suspect until its next scrape succeeds: nothing goes there meanwhile.
        assert not x.load.healthy
        # y can take exactly one request; x could take more and is less loaded, but failed.
        h.scrape(x, waiting=0)
        h.scrape(y, waiting=2)
        await settle()
        assert h.order[1] is r
        assert assigned(r) is y
        assert [assigned(t) for t in others] == [x, x, x]


async def test_retry_falls_back_to_the_failed_backend_when_it_is_the_only_one(
    h: Harness,
) -> None:
    r = h.ticket("r")
    await h.submit(r)
    h.scrape(waiting=10)
    other = h.ticket("o")
    await h.submit(other)
    r.assigned = asyncio.get_running_loop().create_future()
    h.d.retry(r)
    await settle()
    h.scrape(waiting=2)  # one place
    await settle()
    assert assigned(r) is h.entries[0]
    assert other.state is TicketState.QUEUED


async def test_retry_of_a_ticket_that_is_not_running_is_ignored(h: Harness) -> None:
    h.scrape(waiting=10)
    t = h.ticket("a")
    await h.submit(t)
    h.d.retry(t)
    await settle()
    assert t.retries == 0
    assert len(h.d.queue) == 1


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
            h.d.release(h.running()[0])
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
        h.d.release(h.running()[0])
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
            loads = [e.load.in_flight for e in h.entries]
            assert sum(loads) == n
            assert max(loads) <= math.ceil(n / 3) + 2, loads
            assert max(loads) - min(loads) <= 3, loads
        if not prefix:  # no affinity at all: plain least-loaded rotation
            assert [e.load.in_flight for e in h.entries] == [10, 10, 10]
            assert [assigned(t) for t in h.order[:3]] == h.entries


async def test_prefix_affinity_follows_the_backend_that_served_the_prefix_within_slack() -> None:
    tiers = (TierConfig("interactive", max_backend_waiting=1000),)
    async with Harness(2, tiers=tiers, routing_slack=2) as h:
        x, y = h.entries
        h.scrape(x, waiting=10_000)  # y takes the first request with the prefix
        first = h.ticket("a", prefix=PREFIX)
        await h.submit(first)
        assert assigned(first) is y
        h.d.release(first)
        h.scrape()
        fillers = [h.ticket(f"f{i}") for i in range(2)]
        h.scrape(x, waiting=10_000)
        await h.submit(*fillers)  # y: 2 in flight, x: 0
        h.scrape()
        assert [e.load.in_flight for e in (x, y)] == [0, 2]
        same = h.ticket("b", prefix=PREFIX)
        await h.submit(same)
        assert assigned(same) is y  # 2 in flight <= 0 + slack: affinity wins
        again = h.ticket("c", prefix=PREFIX)
        await h.submit(again)
        assert assigned(again) is x  # y at 3 > 0 + slack: load wins
        # A request sharing only part of the prefix still counts its matched blocks.
        partial = h.ticket("d", prefix=(*PREFIX[:2], 12345))
        assert x.prefixes.match(partial.prefix) == y.prefixes.match(partial.prefix) == 2
        await h.submit(partial)
        assert assigned(partial) is x  # equal match: least loaded


# -- prefix grouping within the quantum ----------------------------------------------------


async def remember_prefix(h: Harness, prefix: tuple[int, ...]) -> None:
    """Have the backend serve (and finish) one request with ``prefix`` for user 'seed'."""
    seed = h.ticket("seed", prefix=prefix)
    await h.submit(seed)
    assert assigned(seed) is h.entries[0]
    h.d.release(seed)
    await settle()
    h.order.clear()


async def serve_one_at_a_time(h: Harness, n: int) -> list[str]:
    """Open the gate for one request at a time; return the users in dispatch order."""
    users = []
    for _ in range(n):
        h.scrape(waiting=10)  # closed while the previous one finishes
        for t in h.running():
            h.d.release(t)
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
        h.d.charge(c, 11, 0)  # c is now 11 above a: outside Q
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
