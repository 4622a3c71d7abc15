"""Requests on backends: starting an attempt, and applying what its stream reports.

The dispatcher starts an attempt through a launcher (by default
:class:`~fairq_server.scheduling.attempt_stream.StreamLauncher`), whose sink posts first token,
token counts, end and failure to the dispatcher, which applies them here: backend load and
health, retries, fairness charges and the final event are its decisions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fairq_server.backends.continuation import Progress
from fairq_server.backends.request import StreamEnd
from fairq_server.errors import (
    BackendError,
    BackendFailedError,
    InternalError,
    NoBackendError,
    SchedulerError,
)
from fairq_server.scheduling import events as ev
from fairq_server.scheduling import fair_share
from fairq_server.scheduling.anticipation import Anticipation
from fairq_server.scheduling.attempt_stream import Launcher, StreamLauncher
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.in_force import Settings
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.lookahead import MAX_AHEAD, near_end
from fairq_server.scheduling.model_set import ModelSet
from fairq_server.scheduling.outbox import Finished, Started
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.telemetry import Telemetry
from fairq_server.tenancy.books.book import Claim
from fairq_server.tenancy.checker import Entitlement

__all__ = ["AttemptBook"]

log = logging.getLogger(__name__)


class AttemptBook:
    """The dispatcher's handling of running requests (called from its loop only).

    Args:
        settings: the dispatcher's current settings (read, never written, here).
        models: every model's state (to queue a failed attempt again, to charge fairness).
        telemetry: metrics sink.
        launcher: starts an attempt on its backend.
        clock: the dispatcher's monotonic clock.
        entitlement: quotas and budgets, reserved at each start and settled at each end.
        anticipation: told of each request's end, to hold its slot for its user's next.

    """

    def __init__(
        self,
        settings: Callable[[], Settings],
        models: ModelSet,
        telemetry: Telemetry,
        launcher: Launcher,
        clock: Callable[[], float],
        entitlement: Entitlement | None = None,
        anticipation: Anticipation | None = None,
    ) -> None:
        self._entitlement = entitlement
        self._anticipation = anticipation
        self._settings = settings
        self._models = models
        self._telemetry = telemetry
        self._launcher = launcher
        self._clock = clock
        self.running = 0
        #: The tickets running on each backend (by id), for preemption to choose among.
        self.on_backend: dict[str, set[Ticket]] = {}
        #: Preempted tickets whose slot came free on this backend (see ``Preemptor.repay``).
        self.loans: list[tuple[Ticket, BackendState, Ticket]] = []

    def set_window(self, window: float) -> None:
        """Apply a new read-pacing window to attempts started from now on."""
        if isinstance(self._launcher, StreamLauncher):
            self._launcher.window = window

    def start(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Send ``ticket`` to ``backend`` and tell its caller (unless a hard limit refuses)."""
        if self._entitlement is not None and not self._reserve(ticket):
            return
        tier = self._settings().tiers[ticket.tier].name
        # Decided before the request counts on the backend: the standing it had until now.
        ticket.boosted = fair_share.may_boost(backend, ticket.user)
        backend.started(tier, ticket.user, boosted=ticket.boosted)
        backend.prefixes.add(ticket.prefix)
        self.running += 1
        self.on_backend.setdefault(backend.id, set()).add(ticket)
        resumed = ticket.progress is not None and ticket.progress.preemptions > 0
        if backend.backend.preempt and ticket.progress is None:
            ticket.progress = Progress()
        if ticket.attempt == 0:
            # The queue charged the estimated prompt at dispatch (vtc); settled at the end.
            ticket.charged_prompt = ticket.prompt_tokens
        ticket.state = TicketState.RUNNING
        ticket.backend = backend
        ticket.attempt += 1
        ticket.generating = False
        ticket.dispatched_at = now
        ticket.priority = self._priority(ticket, backend)
        t = self._telemetry
        if ticket.boosted:
            t.boosts_of(backend.id).inc()
        t.dispatches_of(backend.id, tier).inc()
        t.in_flight_of(backend.id).set(backend.in_flight)
        # The backend request goes out before the caller is told, so requests dispatched in
        # one pass reach the backend in dispatch order.
        ticket.handle = self._launcher(ticket)
        if not resumed:  # a preempted request's caller was told once, and sees one stream
            t.queue_wait_of(tier).observe(now - ticket.arrival)
            t.waits.waited(ticket.user, ticket.team, now - ticket.arrival)
            ticket.outbox.put(Started(backend.id, now - ticket.arrival, tier))

    def _reserve(self, ticket: Ticket) -> bool:
        """Reserve the attempt's most against quotas and budgets; False: refused and ended."""
        assert self._entitlement is not None
        claim = self._entitlement.reserve(
            ticket.user, ticket.team, ticket.request.model, ticket.prompt_tokens, ticket.max_tokens
        )
        if isinstance(claim, Claim) or claim is None:
            ticket.claim = claim
            return True
        # A hard limit reached since admission: the queue's dispatch charge is given back (a
        # first attempt's; a retry leaves the queue's front uncharged).
        if ticket.attempt == 0:
            self._charge(ticket, Cost(requests=-1, prompt_tokens=-ticket.prompt_tokens))
        self.abandon(ticket, claim)
        return False

    def _settle(self, ticket: Ticket, prompt: int, completion: int) -> None:
        """Settle the attempt's reservation with what it used (once; later calls do nothing)."""
        claim, ticket.claim = ticket.claim, None
        if claim is not None and self._entitlement is not None:
            self._entitlement.settle(claim, prompt, completion)

    def _priority(self, ticket: Ticket, backend: BackendState) -> int:
        """Return the backend priority: the tier's, or the overtaken tier's if it aged.

        On a backend with fair-share priority the tier's value is encoded with the boost
        (:func:`~fairq_server.scheduling.fair_share.encode`).
        """
        index = ticket.priority_tier if ticket.priority_tier is not None else ticket.tier
        cfg = self._settings().tiers[index]
        tier_priority = cfg.priority if cfg.priority is not None else index
        if fair_share.enabled(backend):
            return fair_share.encode(tier_priority, ticket.boosted)
        return tier_priority

    def apply(self, event: ev.FirstToken | ev.Tokens | ev.StreamEnded | ev.StreamFailed) -> None:
        """Apply a stream event of a running attempt; stale ones are ignored."""
        ticket = event.ticket
        if ticket.attempt != event.attempt or ticket.state is not TicketState.RUNNING:
            return
        match event:
            case ev.FirstToken(at=at):
                self._first_token(ticket, at)
            case ev.Tokens(count=count):
                self._charge(ticket, Cost(completion_tokens=count))
                ticket.charged_completion += count
                self._look_ahead(ticket)
            case ev.StreamEnded(end=end, tokens=tokens):
                self._ended(ticket, end, tokens)
            case ev.StreamFailed(error=error):
                self._failed(ticket, error)

    def _look_ahead(self, ticket: Ticket) -> bool:
        """Count ``ticket``'s slot as free once its end is near (:mod:`.lookahead`).

        Returns True if it now counts as finishing.
        """
        backend = ticket.backend
        if (
            ticket.finishing
            or backend is None
            or backend.finishing >= MAX_AHEAD
            or not near_end(ticket, backend)
        ):
            return False
        model = self._models.get(ticket.request.model)
        if model is None or (
            self._anticipation is not None and self._anticipation.may_hold(model, ticket)
        ):
            return False  # its slot waits for its own user's next request
        ticket.finishing = True
        backend.finishing += 1
        model.queue.tiers[ticket.tier].outstanding.finishing(ticket.user)
        return True

    def _look_ahead_again(self, backend: BackendState) -> None:
        """Let another request near its end count its slot free (a finishing one ended)."""
        for other in self.on_backend.get(backend.id, ()):
            if other.generating and self._look_ahead(other):
                return

    def refused(self, event: ev.Refused) -> None:
        """Queue again an attempt the cluster's shared gate refused (among its user's requests)."""
        ticket = event.ticket
        if ticket.attempt != event.attempt or ticket.state is not TicketState.RUNNING:
            return
        self._release(ticket)
        # Not as a retry: a retry goes before everyone in its tier and past the cluster's
        # fairness floor. The dispatch charge is refunded; it is charged again when popped.
        self._charge(ticket, Cost(requests=-1, prompt_tokens=-ticket.prompt_tokens))
        self._requeue(ticket, retry=False)

    def _first_token(self, ticket: Ticket, at: float) -> None:
        assert ticket.backend is not None
        if ticket.generating:
            return
        ticket.generating = True
        ticket.backend.first_token()
        if ticket.first_token_at is None:
            ticket.first_token_at = at
            tier = self._settings().tiers[ticket.tier].name
            self._telemetry.ttft_of(tier).observe(at - ticket.arrival)
            self._telemetry.waits.first_token(ticket.user, ticket.team, at - ticket.arrival)

    def _ended(self, ticket: Ticket, end: StreamEnd, tokens: int) -> None:
        # Settle the fairness account, quotas and budgets with the backend's own token counts.
        prompt = end.prompt_tokens or ticket.prompt_tokens
        completion = end.completion_tokens or tokens
        self._settle(ticket, prompt, completion)
        model = self._models.get(ticket.request.model)
        # Before the release: the request still counts as its user's.
        held = (
            self._anticipation is not None
            and model is not None
            and self._anticipation.ended(model, ticket, self._clock())
        )
        if not held:
            self.let_go(ticket)
        self._release(ticket)
        ticket.state = TicketState.DONE
        self._charge(
            ticket,
            Cost(
                prompt_tokens=prompt - ticket.charged_prompt,
                completion_tokens=completion - ticket.charged_completion,
            ),
        )
        t = self._telemetry
        t.tokens_of(ticket.group, "prompt").inc(max(prompt, 0))
        t.tokens_of(ticket.group, "completion").inc(max(completion, 0))
        team = t.team_labels.label(ticket.team)
        t.team_tokens_of(team, "prompt").inc(max(prompt, 0))
        t.team_tokens_of(team, "completion").inc(max(completion, 0))
        now = time.monotonic()
        ticket.outbox.put(
            Finished(
                end=end,
                prompt_tokens=prompt,
                completion_tokens=completion,
                queue_seconds=ticket.dispatched_at - ticket.arrival,
                ttft_seconds=(ticket.first_token_at or now) - ticket.arrival,
                total_seconds=now - ticket.arrival,
            )
        )

    def _failed(self, ticket: Ticket, error: Exception) -> None:
        backend = self._release(ticket)
        self.let_go(ticket)  # a failed attempt's slot is never held
        if (
            isinstance(error, BackendError)
            and error.retryable
            and ticket.first_token_at is None
            and ticket.retries < self._settings().config.max_retries
        ):
            log.warning("retrying request %s: %s", ticket.request.request_id, error)
            # Suspect until its next successful scrape: no more work meanwhile.
            backend.suspect()
            self._telemetry.backend_healthy.labels(backend.id).set(0)
            self._telemetry.retries.labels(backend.id).inc()
            ticket.retries += 1
            ticket.excluded |= {backend.id}
            self._requeue(ticket)
            return
        ticket.state = TicketState.DONE
        ticket.outbox.fail(_caller_error(ticket, error))

    def _requeue(self, ticket: Ticket, *, retry: bool = True) -> None:
        """Queue a ticket whose attempt failed before its first token, ahead of its tier.

        With ``retry=False`` (the cluster's shared gate refused it) it goes back among its
        user's requests instead, in its place by the ordering policy, and waits for its
        user's turn like any other.
        """
        model = self._models.get(ticket.request.model)
        if model is None:  # its last backend left, and the model with it
            error = NoBackendError(f"no backend serves model '{ticket.request.model}' any more")
            self.abandon(ticket, error)
            return
        ttl = self._settings().config.queue_ttl_seconds is not None
        if retry:
            model.push(ticket, self._clock(), ttl=ttl, front=True)
        else:
            model.resume(ticket, ttl=ttl)

    def hand_over(self, victim: Ticket, to: Ticket) -> None:
        """Let ``to``, started next, take the slot of ``victim`` (preemption, anticipation).

        ``victim`` is aborted next, or has ended with its slot held for ``to``'s user.
        """
        if isinstance(self._launcher, StreamLauncher):
            self._launcher.hand_over(victim, to)

    def let_go(self, ended: Ticket) -> None:
        """Free the slot kept after ``ended`` for its user (no hold after all, or it lapsed)."""
        if isinstance(self._launcher, StreamLauncher):
            self._launcher.let_go(ended)

    def abort(self, ticket: Ticket) -> None:
        """Abort a running attempt at the backend (the caller is gone)."""
        if ticket.handle is not None:
            ticket.handle.cancel()
        self._release(ticket)

    def abandon(self, ticket: Ticket, error: SchedulerError) -> None:
        """End ``ticket`` with ``error`` wherever it is (refused, expired, or a fault)."""
        if ticket.state is TicketState.DONE:
            return
        if ticket.state is TicketState.RUNNING and ticket.backend is not None:
            self.abort(ticket)
        ticket.stopped_running()  # taken from the queue to run, then refused before it ran
        ticket.state = TicketState.DONE
        ticket.outbox.fail(error)

    def _release(self, ticket: Ticket) -> BackendState:
        backend = ticket.backend
        assert backend is not None, "a running ticket has a backend"
        ticket.backend = None
        ticket.handle = None
        ticket.stopped_running()
        ahead = ticket.finishing
        if ahead:
            ticket.finishing = False
            backend.finishing -= 1
        self.running -= 1
        self.on_backend.get(backend.id, set()).discard(ticket)
        backend.ended(
            self._settings().tiers[ticket.tier].name,
            ticket.user,
            generating=ticket.generating,
            boosted=ticket.boosted,
        )
        ticket.boosted = False
        if ticket.lender is not None:
            self.loans.append((ticket.lender, backend, ticket))
            ticket.lender = None
        self._telemetry.in_flight_of(backend.id).set(backend.in_flight)
        if ahead:
            self._look_ahead_again(backend)
        # Ended otherwise than by its stream's end: what it used so far (nothing before its
        # first token; a retry or a resumed preemption reserves again when it starts).
        if ticket.generating:
            self._settle(ticket, int(ticket.charged_prompt), ticket.charged_completion)
        else:
            self._settle(ticket, 0, 0)
        return backend

    def _charge(self, ticket: Ticket, cost: Cost) -> None:
        model = self._models.get(ticket.request.model)
        if model is not None:
            model.queue.tiers[ticket.tier].charge(ticket, cost)


def _caller_error(ticket: Ticket, error: Exception) -> SchedulerError:
    """Return what the caller sees: the backend's error, fairq's own, or INTERNAL."""
    if isinstance(error, BackendError):
        log.info("request %s failed on its backend: %s", ticket.request.request_id, error)
        return BackendFailedError(error)
    if isinstance(error, SchedulerError):
        return error
    log.error(
        "request %s failed inside fairq",
        ticket.request.request_id,
        exc_info=(type(error), error, error.__traceback__),
    )
    return InternalError()
