"""The dispatcher: one loop per model, the only writer of that model's queue state.

Servicers never touch the queue. They post commands (submit, release, retry, charge)
to the dispatcher's inbox and await the futures carried by their :class:`Ticket`. The loop
applies the commands in order, then forwards work while some backend's gate admits it, then
sleeps until a command arrives, a scrape lands, or the polling interval passes (stale metrics
must be noticed even when nothing happens).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fairq_server.backends.registry import BackendEntry, BackendPool
from fairq_server.config import SchedulerConfig, TierConfig
from fairq_server.errors import (
    QueueFullError,
    QueueTimeoutError,
    SchedulerError,
    ShuttingDownError,
)
from fairq_server.scheduling.gate import GateOutcome, admit, estimated_waiting
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry

__all__ = ["Dispatcher"]

log = logging.getLogger(__name__)

#: Requests started per pass before the loop yields. Each start wakes a servicer that opens
#: a backend request (about a millisecond of CPU); when thousands of slots free at once, the
#: yield lets other work on the event loop (health checks, new calls, scrapes) run between
#: batches instead of after all of them.
DISPATCH_BATCH = 32


@dataclass(frozen=True)
class _Submit:
    ticket: Ticket


@dataclass(frozen=True)
class _Release:
    ticket: Ticket


@dataclass(frozen=True)
class _FirstToken:
    ticket: Ticket


@dataclass(frozen=True)
class _Retry:
    ticket: Ticket


@dataclass(frozen=True)
class _Charge:
    ticket: Ticket
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class _Reconfigure:
    tiers: tuple[TierConfig, ...]
    config: SchedulerConfig
    queue: ModelQueue | None


_Command = _Submit | _Release | _FirstToken | _Retry | _Charge | _Reconfigure


class Dispatcher:
    """Queues and dispatches the requests of one model.

    Args:
        model: the model name.
        queue: the model's queue (owned by this dispatcher from now on).
        tiers: tier configurations, in strict order.
        pool: registered backends; the dispatcher uses those serving ``model``.
        config: scheduler settings (caps, polling interval, staleness).
        telemetry: metrics sink.

    """

    def __init__(
        self,
        model: str,
        queue: ModelQueue,
        tiers: Sequence[TierConfig],
        pool: BackendPool,
        config: SchedulerConfig,
        telemetry: Telemetry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.queue = queue
        self.tiers = tuple(tiers)
        self._pool = pool
        self._config = config
        self._telemetry = telemetry
        self._clock = clock
        self._inbox: deque[_Command] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._depth = [telemetry.queue_depth.labels(model, t.name) for t in self.tiers]
        # Tickets in arrival order, for the queue time-to-live (stale entries are skipped).
        self._arrivals: deque[Ticket] = deque()
        # When each tier last dispatched, or last went from empty to backlogged (aging).
        self._last_served = [clock()] * len(self.tiers)

    # -- commands (any task) ------------------------------------------------------------

    def submit(self, ticket: Ticket) -> None:
        """Ask for ``ticket`` to be queued; ``ticket.enqueued`` resolves with its position."""
        self._post(_Submit(ticket))

    def release(self, ticket: Ticket) -> None:
        """Finalize ``ticket``: removed if still queued, its backend slot freed if running.

        Servicers call this exactly once per ticket, when they stop serving it for any reason
        (finished, failed, cancelled by the client, deadline).
        """
        self._post(_Release(ticket))

    def first_token(self, ticket: Ticket) -> None:
        """Report that ``ticket``'s backend has started generating (it no longer waits there)."""
        self._post(_FirstToken(ticket))

    def retry(self, ticket: Ticket) -> None:
        """Requeue ``ticket`` ahead of its tier after its backend failed before any token.

        The caller must give the ticket a fresh ``assigned`` future before calling.
        """
        self._post(_Retry(ticket))

    def charge(self, ticket: Ticket, prompt_tokens: int, completion_tokens: int) -> None:
        """Charge tokens processed for ``ticket`` to its user's fairness counter."""
        # No wake-up: a charge changes who goes next, not whether anything may go now.
        self._inbox.append(_Charge(ticket, prompt_tokens, completion_tokens))

    def reconfigure(
        self, tiers: Sequence[TierConfig], config: SchedulerConfig, queue: ModelQueue | None
    ) -> None:
        """Switch to new settings (SIGHUP reload) without losing a queued request.

        Args:
            tiers: the new tier settings; names and order must be unchanged.
            config: the new scheduler settings.
            queue: an empty queue built with new policies, or None to keep the current one.
                Tickets move over in arrival order; fairness counters start afresh.

        """
        self._post(_Reconfigure(tuple(tiers), config, queue))

    def _apply_reconfigure(self, command: _Reconfigure) -> None:
        self.tiers = command.tiers
        self._config = command.config
        if command.queue is not None:
            old, self.queue = self.queue, command.queue
            moved = []
            for tier in range(len(old.tiers)):
                while len(old.tiers[tier]):
                    moved.append(old.pop(tier))
            for ticket in sorted(moved, key=lambda t: t.seq):
                self.queue.push(ticket, front=ticket.retries > 0)

    def wake(self) -> None:
        """Re-run dispatch (a scrape landed or the backend set changed)."""
        self._wake.set()

    def _post(self, command: _Command) -> None:
        self._inbox.append(command)
        self._wake.set()
        if self._closed and (self._task is None or self._task.done()):
            # The loop is gone, so nothing else will apply this, and nothing else writes the
            # queue any more. A request arriving during shutdown gets its UNAVAILABLE now
            # instead of waiting out the server's grace period for a loop that never runs.
            self._evict_all()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the dispatch loop."""
        self._task = asyncio.create_task(self.run(), name=f"dispatch-{self.model}")

    async def close(self) -> None:
        """Stop the loop and evict every queued ticket with UNAVAILABLE."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._evict_all()

    def _evict_all(self) -> None:
        """Apply pending commands, then fail every queued ticket (the loop has stopped)."""
        self._apply_inbox()
        error = ShuttingDownError("fairq is shutting down; the request was not started")
        for tier in range(len(self.tiers)):
            while len(self.queue.tiers[tier]):
                self._fail(self.queue.pop(tier), error)
        self._update_depth()

    async def run(self) -> None:
        """Apply commands and dispatch until cancelled."""
        while True:
            interval = self._config.poll_interval_seconds
            self._wake.clear()
            self._apply_inbox()
            self._expire()
            more = self._dispatch()
            self._update_depth()
            if more:
                await asyncio.sleep(0)  # let the started requests and everyone else run
                continue
            if self._inbox:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()

    # -- the loop's work ----------------------------------------------------------------

    def _apply_inbox(self) -> None:
        while self._inbox:
            command = self._inbox.popleft()
            if isinstance(command, _Reconfigure):
                self._apply_reconfigure(command)
                continue
            ticket = command.ticket
            if isinstance(command, _Submit):
                self._enqueue(ticket)
            elif isinstance(command, _Release):
                if ticket.state is TicketState.QUEUED:
                    self.queue.remove(ticket)
                elif ticket.state is TicketState.RUNNING:
                    self._release(ticket)
                ticket.state = TicketState.DONE
            elif isinstance(command, _FirstToken):
                if ticket.state is TicketState.RUNNING and not ticket.generating:
                    ticket.generating = True
                    assert ticket.entry is not None
                    ticket.entry.load.awaiting_first_token -= 1
            elif isinstance(command, _Retry):
                if ticket.state is TicketState.RUNNING:
                    entry = self._release(ticket)
                    # Suspect until its next successful scrape: no more work meanwhile.
                    entry.load.healthy = False
                    ticket.retries += 1
                    ticket.excluded |= {entry.backend.id}
                    self._telemetry.retries.labels(entry.backend.id).inc()
                    self.queue.push(ticket, front=True)
                    if self._config.queue_ttl_seconds is not None:
                        # Among the oldest by arrival, so it goes in front for the TTL too.
                        self._arrivals.appendleft(ticket)
            else:
                self.queue.tiers[ticket.tier].fairness.charge_tokens(
                    ticket.user, command.prompt_tokens, command.completion_tokens, ticket.weight
                )

    def _enqueue(self, ticket: Ticket) -> None:
        if self._closed:
            self._fail(ticket, ShuttingDownError("fairq is shutting down"))
            return
        cfg = self._config
        if len(self.queue) >= cfg.max_queued_total:
            self._fail(
                ticket,
                QueueFullError(
                    f"queue for model '{self.model}' is full ({len(self.queue)} requests)"
                ),
            )
            return
        if self.queue.user_len(ticket.user) >= cfg.max_queued_per_user:
            self._fail(
                ticket,
                QueueFullError(
                    f"user '{ticket.user}' already has {cfg.max_queued_per_user} queued requests"
                ),
            )
            return
        if not len(self.queue.tiers[ticket.tier]):
            self._last_served[ticket.tier] = self._clock()
        position = self.queue.push(ticket)
        if cfg.queue_ttl_seconds is not None:
            self._arrivals.append(ticket)
        if not ticket.enqueued.done():
            ticket.enqueued.set_result(position)

    def _expire(self) -> None:
        """Answer DEADLINE_EXCEEDED to tickets queued longer than the queue TTL."""
        ttl = self._config.queue_ttl_seconds
        if ttl is None:
            self._arrivals.clear()
            return
        deadline = self._clock() - ttl
        arrivals = self._arrivals
        # The head is either no longer queued (dispatched or released: just forget it) or the
        # oldest queued ticket; stop at the first one still within its time.
        while arrivals and (
            arrivals[0].state is not TicketState.QUEUED or arrivals[0].arrival <= deadline
        ):
            ticket = arrivals.popleft()
            if ticket.state is TicketState.QUEUED:
                self.queue.remove(ticket)
                self._fail(
                    ticket,
                    QueueTimeoutError(f"request waited in the queue longer than {ttl:g} s"),
                )

    def _dispatch(self) -> bool:
        """Start what the gates admit, at most :data:`DISPATCH_BATCH` requests.

        Returns:
            True if the batch was full (more may be admitted after a yield).

        """
        now = self._clock()
        for _ in range(DISPATCH_BATCH):
            first = self.queue.first_tier()
            if first is None:
                return False
            # Gates are checked against the highest backlogged tier; an aged lower tier
            # overtakes under that gate, since its own may never open while the higher tier
            # keeps the backend busy.
            candidates = self._admitting(first, now)
            if not candidates:
                # Strict tiers: lower tiers wait too. Their gates are no looser by design.
                return False
            tier = self._aged_tier(first, now)
            tier_queue = self.queue.tiers[tier]
            retry = tier_queue.peek_retry() if tier_queue.has_retries else None
            preferred = [e for e in candidates if retry and e.backend.id not in retry.excluded]
            if retry is not None and (preferred or not self._another_backend(retry)):
                ticket = self.queue.pop(tier)
                entry = self._route(ticket, preferred or candidates)
            elif tier_queue.active_users:
                # A retry, if any, waits for a backend it has not failed on; the backends
                # admitting now serve the requests behind it meanwhile.
                user, entry = self._pick(tier, candidates)
                ticket = self.queue.pop(tier, user)
            else:
                return False  # only a waiting retry: strict tiers keep lower ones behind it
            self._last_served[tier] = now
            # An aged request is sent with the priority of the tier it overtook, so a
            # priority-scheduling backend does not let later higher-tier work pass it again.
            ticket.priority_tier = first
            self._start(ticket, entry, now)
        return True

    def _another_backend(self, ticket: Ticket) -> bool:
        """Whether a healthy backend of the model exists that ``ticket`` has not failed on."""
        return any(
            e.backend.id not in ticket.excluded and e.load.healthy and not e.load.draining
            for e in self._pool.for_model(self.model)
        )

    def _near(self, candidates: list[BackendEntry]) -> list[BackendEntry]:
        """Backends loaded at most ``routing_slack`` requests above the least loaded one."""
        if len(candidates) == 1:
            return candidates
        least = min(e.load.in_flight for e in candidates)
        slack = self._config.routing_slack
        return [e for e in candidates if e.load.in_flight <= least + slack]

    def _route(self, ticket: Ticket, candidates: list[BackendEntry]) -> BackendEntry:
        """Choose the backend for ``ticket``: longest remembered prefix, then least loaded."""
        return min(
            self._near(candidates),
            key=lambda e: (-e.prefixes.match(ticket.prefix), *_load_key(e)),
        )

    def _pick(self, tier: int, candidates: list[BackendEntry]) -> tuple[str, BackendEntry]:
        """Choose the user to serve and its backend (prefix grouping within quantum Q).

        With Q = 0 the fairness policy's choice stands and only the backend is chosen by
        prefix affinity. With Q > 0, any user whose counter is within Q of the minimum may go
        instead if its next request has a longer prefix remembered by an admitting backend;
        ties keep fairness order.
        """
        fairness = self.queue.tiers[tier].fairness
        quantum = self._config.prefix_quantum
        if quantum > 0:
            users = fairness.candidates(quantum, self._config.prefix_candidates)
        else:
            users = [fairness.select()]
        near = self._near(candidates)
        if len(users) == 1 and len(near) == 1:
            return users[0], near[0]
        best: tuple[tuple[float, ...], str, BackendEntry] | None = None
        for rank, user in enumerate(users):
            prefix = self.queue.tiers[tier].head_of(user).prefix
            for entry in near:
                key = (-entry.prefixes.match(prefix), rank, *_load_key(entry))
                if best is None or key < best[0]:
                    best = (key, user, entry)
        assert best is not None
        return best[1], best[2]

    def _aged_tier(self, first: int, now: float) -> int:
        """Return a lower tier whose aging bound is due, or ``first``."""
        for tier in range(len(self.tiers) - 1, first, -1):
            aging = self.tiers[tier].aging_seconds
            if (
                aging is not None
                and len(self.queue.tiers[tier])
                and now - self._last_served[tier] >= aging
            ):
                return tier
        return first

    def _admitting(self, tier: int, now: float) -> list[BackendEntry]:
        cfg = self.tiers[tier]
        stale_after = self._config.stale_after_seconds
        admitted = []
        for entry in self._pool.for_model(self.model):
            outcome = admit(entry.load, cfg, now, stale_after)
            if outcome is GateOutcome.ADMIT:
                admitted.append(entry)
            else:
                self._telemetry.gate_refusals.labels(entry.backend.id, outcome.value).inc()
        return admitted

    def _start(self, ticket: Ticket, entry: BackendEntry, now: float) -> None:
        load = entry.load
        load.dispatched += 1
        load.in_flight += 1
        name = self.tiers[ticket.tier].name
        load.tier_in_flight[name] = load.tier_in_flight.get(name, 0) + 1
        load.awaiting_first_token += 1
        ticket.generating = False
        entry.idle.clear()
        ticket.state = TicketState.RUNNING
        ticket.entry = entry
        entry.prefixes.add(ticket.prefix)
        tier = self.tiers[ticket.tier].name
        self._telemetry.dispatches.labels(entry.backend.id, tier).inc()
        self._telemetry.queue_wait.labels(tier).observe(now - ticket.arrival)
        self._telemetry.backend_in_flight.labels(entry.backend.id).set(load.in_flight)
        if ticket.assigned.done():  # the servicer already gave up
            self._release(ticket)
            ticket.state = TicketState.DONE
        else:
            ticket.assigned.set_result(entry)

    def _release(self, ticket: Ticket) -> BackendEntry:
        entry = ticket.entry
        assert entry is not None, "a running ticket has a backend"
        ticket.entry = None
        load = entry.load
        load.in_flight -= 1
        load.finished += 1
        load.tier_in_flight[self.tiers[ticket.tier].name] -= 1
        if not ticket.generating:
            load.awaiting_first_token -= 1
        self._telemetry.backend_in_flight.labels(entry.backend.id).set(load.in_flight)
        if load.in_flight == 0:
            entry.idle.set()
        return entry

    def _fail(self, ticket: Ticket, error: SchedulerError) -> None:
        ticket.state = TicketState.DONE
        for future in (ticket.enqueued, ticket.assigned):
            if not future.done():
                future.set_exception(error)
                # The servicer may already be gone; never warn about an unread exception.
                future.exception()

    def _update_depth(self) -> None:
        for gauge, tier in zip(self._depth, self.queue.tiers, strict=True):
            gauge.set(len(tier))


def _load_key(entry: BackendEntry) -> tuple[float, int]:
    return estimated_waiting(entry.load), entry.load.in_flight
