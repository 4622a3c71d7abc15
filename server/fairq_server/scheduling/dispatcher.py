"""The dispatcher: one loop, the only writer of scheduling state.

It owns every model's queue, every backend's load and health, and the settings in use.
Events arrive in its inbox (:mod:`.events`): requests submitted and cancelled, scrapes, first
token / tokens / end / failure from the stream readers, backends added and removed, a reload.
The loop applies them in arrival order, then forwards work while some backend's gate admits
it, then sleeps until the next event or the polling interval (stale metrics must be noticed
even when nothing happens). Its helpers (:mod:`.picking`, :mod:`.attempts`) are given the
parts of its state they work on, never the dispatcher itself.

The loop is supervised: an exception while applying one event fails that event's request
with INTERNAL; an exception anywhere else fails the queued requests (the queue may be
inconsistent), reports NOT_SERVING, and restarts the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from fairq_server.backends.base import Backend
from fairq_server.backends.poller import ScrapeResult
from fairq_server.config.scheduler import SchedulerConfig
from fairq_server.config.tiers import TierConfig
from fairq_server.errors import InternalError, SchedulerError, ShuttingDownError
from fairq_server.runtime.supervisor import RESTART_DELAYS, stop_task, supervise
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.admission import admission_error
from fairq_server.scheduling.anticipation import Anticipation
from fairq_server.scheduling.attempt_stream import Launcher, StreamLauncher
from fairq_server.scheduling.attempts import AttemptBook
from fairq_server.scheduling.backend_set import BackendSet
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.expiry import expire_queued, sweep_unserved
from fairq_server.scheduling.in_force import Settings
from fairq_server.scheduling.metric_gaps import relied_on
from fairq_server.scheduling.model_set import ModelSet
from fairq_server.scheduling.model_state import ModelState
from fairq_server.scheduling.outbox import Queued
from fairq_server.scheduling.picking import Picker
from fairq_server.scheduling.policies import Policies
from fairq_server.scheduling.preemption import Preemptor
from fairq_server.scheduling.prefix import PrefixCache
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.shared_counters import apply_cluster_event
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry
from fairq_server.tenancy.checker import Entitlement

__all__ = ["Dispatcher"]

log = logging.getLogger(__name__)

#: Requests started per pass before the loop yields: each start opens a backend request (~1 ms
#: of CPU), so when thousands of slots free at once, other work runs between batches.
DISPATCH_BATCH = 32
#: Seconds between checks for models no backend serves (see ``ModelSet.sweep``).
_SWEEP_EVERY = 0.1


class Dispatcher:
    """Queues requests of every model and dispatches them to backends.

    Args:
        tiers: tier configurations, in strict order.
        config: scheduler settings (caps, polling interval, staleness, retries).
        telemetry: metrics sink.
        policies: fairness, ordering, gate and router plugins.
        launcher: starts a ticket's attempt on its backend (None: read the backend's stream
            with :class:`~fairq_server.scheduling.attempt_stream.StreamLauncher`).
        clock: monotonic time source.
        on_health: told False when the loop crashed and True when it runs again.
        entitlement: quotas and budgets (None: none are checked).

    """

    def __init__(
        self,
        tiers: Sequence[TierConfig],
        config: SchedulerConfig,
        telemetry: Telemetry,
        policies: Policies,
        launcher: Launcher | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_health: Callable[[bool], None] = lambda serving: None,
        entitlement: Entitlement | None = None,
    ) -> None:
        self._settings = Settings(tuple(tiers), config, policies)
        self._telemetry = telemetry
        self._clock = clock
        self._on_health = on_health
        self._inbox: deque[ev.Event] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._backends = BackendSet()
        self._models = ModelSet(telemetry)
        launcher = launcher or StreamLauncher(self.post, config.stream_coalesce_seconds)
        read = self._read_settings  # the helpers read the settings; only the loop writes them
        self.entitlement = entitlement
        self.anticipation = Anticipation(read, self._backends, telemetry)
        self.attempts = AttemptBook(
            read, self._models, telemetry, launcher, clock, entitlement, self.anticipation
        )
        self.anticipation.hand_over = self.attempts.hand_over
        self.anticipation.let_go = self.attempts.let_go
        if isinstance(launcher, StreamLauncher):
            launcher.may_hold = self._may_hold
        self._picker = Picker(
            read, self._models, self._backends, self.attempts.start, telemetry, entitlement,
            self.anticipation,
        )  # fmt: skip
        self._preemptor = Preemptor(read, self._models, self._backends, self.attempts, telemetry)
        self.crashes = 0
        self._next_sweep = 0.0
        self.restart_delays: Sequence[float] = RESTART_DELAYS

    # -- events (any task) --------------------------------------------------------------

    def post(self, event: ev.Event) -> None:
        """Hand ``event`` to the loop."""
        self._inbox.append(event)
        self._wake.set()
        if self._closed and (self._task is None or self._task.done()):
            # The loop is gone, so nothing else applies this, and nothing else writes any
            # more: a request arriving during shutdown gets its answer now.
            self._apply_inbox()

    def submit(self, ticket: Ticket) -> None:
        """Queue ``ticket``; its outbox tells the caller what happens."""
        self.post(ev.Submit(ticket))

    def cancel(self, ticket: Ticket) -> None:
        """Report that the caller stopped reading ``ticket``; harmless once it is done."""
        self.post(ev.Cancel(ticket))

    def scrape_sent(self, backend_id: str) -> None:
        """Report that a scrape of ``backend_id`` is being sent now."""
        self.post(ev.ScrapeSent(backend_id))

    def scrape_landed(self, backend_id: str, result: ScrapeResult) -> None:
        """Report the outcome of the last scrape of ``backend_id``."""
        self.post(ev.ScrapeLanded(backend_id, result))

    async def add_backend(self, backend: Backend) -> BackendState:
        """Start routing to ``backend`` (replacing one with the same id); return its state."""
        state = BackendState(backend, PrefixCache(self.config.prefix_cache_blocks))
        self.post(ev.AddBackend(state))
        await self.sync()
        return state

    async def remove_backend(self, backend_id: str) -> BackendState | None:
        """Stop routing to ``backend_id``; return its state (None if unknown)."""
        done: asyncio.Future[BackendState | None] = asyncio.get_running_loop().create_future()
        self.post(ev.RemoveBackend(backend_id, done))
        return await done

    async def reconfigure(
        self, tiers: Sequence[TierConfig], config: SchedulerConfig, policies: Policies,
        *, rebuild: bool,
    ) -> None:  # fmt: skip
        """Switch to new settings (SIGHUP reload) without losing a queued request.

        Returns once the loop has applied them, whole. With ``rebuild``, queues are rebuilt
        with the new fairness and ordering policies (arrival order kept; counters afresh).
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.post(ev.Reconfigure(tuple(tiers), config, policies, rebuild, done))
        await done

    def wake(self) -> None:
        """Run a pass now (nothing changed that an event would say; e.g. time passed)."""
        self._wake.set()

    async def sync(self) -> None:
        """Return once every event posted before this call has been applied."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.post(ev.Barrier(done))
        await done

    # -- reads (any task; never write) ----------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The tiers, scheduler settings and plugins in use (the one copy at run time)."""
        return self._settings

    def _may_hold(self, ticket: Ticket) -> bool:
        """Whether the slot of ``ticket``, whose stream just ended, may be held for its user.

        Asked by a launcher that keeps slots claimed elsewhere (a cluster's shared gate). If
        the loop has not applied the end yet, whether it may decide to hold it (it then lets
        the slot go or hands it over); if it has, whether it did.
        """
        model = self._models.get(ticket.request.model)
        if model is None:
            return False
        if ticket.state is TicketState.RUNNING and ticket.backend is not None:
            return self.anticipation.may_hold(model, ticket)
        return self.anticipation.holding(model.name, ticket)

    def _read_settings(self) -> Settings:
        return self._settings

    @property
    def tiers(self) -> tuple[TierConfig, ...]:
        """The tiers in use, in strict order."""
        return self._settings.tiers

    @property
    def config(self) -> SchedulerConfig:
        """The scheduler settings in use."""
        return self._settings.config

    @property
    def policies(self) -> Policies:
        """The plugins in use."""
        return self._settings.policies

    def backend(self, backend_id: str) -> BackendState | None:
        """Return the state of registered backend ``backend_id``."""
        return self._backends.get(backend_id)

    def backends(self) -> list[BackendState]:
        """Return the states of all registered backends."""
        return self._backends.all()

    def models(self) -> set[str]:
        """Return every model some registered backend serves."""
        return self._backends.models()

    def queue(self, model: str) -> ModelQueue:
        """Return the queue of ``model`` (KeyError if no backend ever served it)."""
        return self._models[model].queue

    def model_state(self, model: str) -> ModelState | None:
        """Return the state of ``model``, if some backend ever served it."""
        return self._models.get(model)

    def model_states(self) -> list[ModelState]:
        """Return every model's state."""
        return list(self._models.values())

    def now(self) -> float:
        """Return the loop's clock (monotonic seconds)."""
        return self._clock()

    def live_requests(self) -> int:
        """Count the requests queued or running, over all models."""
        return sum(len(m.queue) for m in self._models.values()) + self.attempts.running

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop."""
        self._task = asyncio.create_task(self.run(), name="dispatcher")

    async def close(self) -> None:
        """Stop the loop and answer every queued request UNAVAILABLE.

        Running requests go on: their events are applied as they come (see :meth:`post`).
        """
        self._closed = True
        await stop_task(self._task)
        self._apply_inbox()
        self._fail_queued(ShuttingDownError("fairq is shutting down; the request was not started"))

    async def run(self) -> None:
        """Run the loop until cancelled, restarting it after a crash."""
        await supervise(
            "dispatcher loop",
            self._loop,
            on_crash=self._crashed,
            on_restart=lambda: self._on_health(True),
            delays=self.restart_delays,
        )

    def _crashed(self, exc: BaseException) -> None:
        self.crashes += 1
        self._on_health(False)
        self._fail_queued(InternalError())

    async def _loop(self) -> None:
        while True:
            interval = self.config.poll_interval_seconds
            self._wake.clear()
            self._apply_inbox()
            now = self._clock()
            expire_queued(self._models, self.attempts, self.config.queue_ttl_seconds, now)
            if now >= self._next_sweep:
                # Seconds need no finer check; every pass would cost O(models) per event.
                self._next_sweep = now + _SWEEP_EVERY
                grace = self.config.no_backend_grace_seconds
                sweep_unserved(self._models, self._backends.of, self.attempts, grace, now)
            self.anticipation.expire(now)
            self._preemptor.repay(now)  # before any pick: a preempted request's slot is its own
            more = self._picker.dispatch(now, DISPATCH_BATCH)
            more |= self._preemptor.run(now) > 0
            for model in self._models.values():
                model.update_depth()
            if more:
                await asyncio.sleep(0)  # let the started requests and everyone else run
                continue
            if self._inbox:
                continue
            lapse = self.anticipation.next_deadline()
            if lapse is not None:  # a held slot goes to the fair pick when its hold lapses
                interval = max(0.0, min(interval, lapse - self._clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()

    # -- applying events ----------------------------------------------------------------

    def _apply_inbox(self) -> None:
        while self._inbox:
            event = self._inbox.popleft()
            try:
                self._apply(event)
            except Exception as exc:
                ticket, done = getattr(event, "ticket", None), getattr(event, "done", None)
                log.exception("applying %s failed", type(event).__name__)
                if isinstance(ticket, Ticket):
                    self.attempts.abandon(ticket, InternalError())
                if isinstance(done, asyncio.Future) and not done.done():
                    done.set_exception(exc)  # whoever waits for it must not wait for ever

    def _apply(self, event: ev.Event) -> None:
        match event:
            case ev.Submit(ticket):
                self._submit(ticket)
            case ev.Cancel(ticket):
                self._cancel(ticket)
            case ev.ScrapeSent(backend_id):
                if (state := self._backends.get(backend_id)) is not None:
                    state.scrape_sent(self._clock())
            case ev.ScrapeLanded(backend_id, result):
                self._scrape_landed(backend_id, result)
            case ev.FirstToken() | ev.Tokens() | ev.StreamEnded() | ev.StreamFailed():
                self.attempts.apply(event)
            case ev.Refused():
                self.attempts.refused(event)
            case ev.PeerView() | ev.TakeJournals() | ev.FairnessSync():
                apply_cluster_event(
                    event, self._models, self._backends, self._clock(), self._picker.in_band
                )
            case ev.AddBackend(state):
                self._add_backend(state)
            case ev.RemoveBackend(backend_id, done):
                state = self._backends.drop(backend_id)
                if not done.done():
                    done.set_result(state)
            case ev.Reconfigure():
                self._reconfigure(event)
            case ev.Barrier(done):
                if not done.done():
                    done.set_result(None)

    def _submit(self, ticket: Ticket) -> None:
        if ticket.state is not TicketState.NEW:
            return
        model = ticket.request.model
        state = self._models.get(model)
        queue, backends = None if state is None else state.queue, self._backends.of(model)
        error = admission_error(
            model,
            ticket.user,
            backends,
            queue,
            self.config,
            closed=self._closed,
            queues=[m.queue for m in self._models.values()],
        )
        if error is not None:
            return self.attempts.abandon(ticket, error)
        assert state is not None
        now = self._clock()
        self.anticipation.arrived(ticket, now)
        position = state.push(ticket, now, ttl=self.config.queue_ttl_seconds is not None)
        ticket.outbox.put(Queued(position))

    def _cancel(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.QUEUED:
            self._models[ticket.request.model].queue.remove(ticket)
        elif ticket.state is TicketState.RUNNING:
            self.attempts.abort(ticket)
        ticket.state = TicketState.DONE

    def _scrape_landed(self, backend_id: str, result: ScrapeResult) -> None:
        state = self._backends.get(backend_id)
        if state is None:
            return
        state.scrape_landed(result, self.config.unhealthy_after_failures, relied_on(self.tiers))
        self._telemetry.scraped(
            backend_id, state.sample, state.tpot_seconds,
            healthy=bool(state.healthy), failed=isinstance(result, Exception),
            gaps=state.metric_gaps,
        )  # fmt: skip

    def _add_backend(self, state: BackendState) -> None:
        self._backends.add(state)
        now = self._clock()
        # A model's queue outlives its backends for a grace period: when the last backend of a
        # model leaves, queued requests wait no_backend_grace_seconds for another one.
        for model in state.backend.models:
            self._models.ensure(model, self._new_queue, self.tiers, now)

    def _new_queue(self) -> ModelQueue:
        return self.policies.new_queue(len(self.tiers))

    def _reconfigure(self, event: ev.Reconfigure) -> None:
        if event.rebuild:  # first: if it fails, the old settings stand
            self._models.rebuild(lambda: event.policies.new_queue(len(event.tiers)))
        self._settings = Settings(event.tiers, event.config, event.policies)
        self.attempts.set_window(event.config.stream_coalesce_seconds)
        if event.done is not None and not event.done.done():
            event.done.set_result(None)

    def _fail_queued(self, error: SchedulerError) -> None:
        for ticket in self._models.take_queued(self._new_queue):
            self.attempts.abandon(ticket, error)
