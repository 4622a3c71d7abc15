"""Preemption by continuation: free a running slot for a request that should run now.

After each dispatch pass, for every model whose next request (the one its highest backlogged
tier would serve next) has waited longer than its tier's ``preempt_after_seconds``, while
every running slot of a backend that allows preemption is taken (``in_flight`` at the
backend's ``max_in_flight``), the dispatcher preempts one running request there
(:mod:`.victims` chooses it), starts the waiting request in its slot, and queues the victim
again as a continuation (:mod:`fairq_server.backends.continuation`): its caller keeps reading
the same stream, which pauses and then goes on.

The prefill the continuation does again is charged to the waiting request's user, who caused
it; the victim's user pays for its prompt and output once, as if never preempted.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator

from fairq_server.backends.continuation import exempt_reason, short_of_room
from fairq_server.config.preempt import PreemptConfig
from fairq_server.errors import NoBackendError
from fairq_server.scheduling.anticipation import share_slots
from fairq_server.scheduling.attempts import AttemptBook
from fairq_server.scheduling.backend_set import BackendSet
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.in_force import Settings
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.model_set import ModelSet
from fairq_server.scheduling.model_state import ModelState
from fairq_server.scheduling.ticket import Ticket, TicketState
from fairq_server.scheduling.victims import (
    RateCap,
    Running,
    Waiting,
    choose_victim,
    rank,
    slot_frees_soon,
)
from fairq_server.telemetry import Telemetry

__all__ = ["Preemptor"]

log = logging.getLogger(__name__)

#: Queued users compared per pass when looking for the one that should run now (bounds the
#: work of a pass on a tier with very many users).
MAX_USERS_COMPARED = 256


class Preemptor:
    """The preemption pass over the dispatcher's state (called from its loop only).

    Args:
        settings: the dispatcher's current settings (read, never written, here).
        models: every model's state and queue.
        backends: the registered backends.
        attempts: the running requests (aborted and started through it).
        telemetry: metrics sink.

    """

    def __init__(
        self,
        settings: Callable[[], Settings],
        models: ModelSet,
        backends: BackendSet,
        attempts: AttemptBook,
        telemetry: Telemetry,
    ) -> None:
        self._settings = settings
        self._models = models
        self._backends = backends
        self._attempts = attempts
        self._telemetry = telemetry
        self._caps: dict[str, RateCap] = {}

    def run(self, now: float) -> int:
        """Preempt for each model's next request if it waited too long; return how many."""
        if not any(t.preempt_after_seconds is not None for t in self._settings().tiers):
            return 0
        done = 0
        for model in list(self._models.values()):
            if len(model.queue) and self._preempt_for(model, now):
                done += 1
        return done

    def _preempt_for(self, model: ModelState, now: float) -> bool:
        tier = model.queue.first_tier()
        if tier is None:
            return False
        after = self._settings().tiers[tier].preempt_after_seconds
        if after is None:
            return False
        best: tuple[Running, Ticket, BackendState, Ticket] | None = None
        slots = share_slots(self._backends, model.name)
        for backend in self._full_backends(model.name):
            cap = self._caps.setdefault(backend.id, RateCap(self._cfg.max_per_second))
            cap.per_second = self._cfg.max_per_second
            if not cap.allows(now):
                continue
            head = _waiting(model, tier, backend)
            if (
                head is None
                or now - head.arrival < after
                or backend.id in head.excluded
                # A preempted request resumes into freed slots; it never preempts in turn.
                or (head.progress is not None and head.progress.preemptions > 0)
            ):
                continue
            waiting = Waiting(
                tier=tier,
                standing=backend.user_in_flight.get(head.user, 0) / head.weight,
                step=1 / head.weight,
            )
            tickets = self._attempts.on_backend.get(backend.id, set())
            running = list(self._candidates(backend, tickets))
            if slots and tier < len(model.queue.tiers):
                # Where slots are shared max-min (teams first), only a user below its share
                # preempts, and only a request of a user (or team) at its share of the same
                # tier: the per-user standing alone knows no teams, and preempted a team
                # within its share for another team's user, which the shares then gave
                # back (0.88 of the engine's efficiency, teams 3:1 on the simulator).
                shares = model.queue.tiers[tier].outstanding
                if not shares.below(head.user, slots):
                    continue
                running = [
                    r
                    for r in running
                    if r.tier != tier
                    or (isinstance(r.key, Ticket) and shares.at_share(r.key.user, slots))
                ]
            if waiting.standing > 0 and slot_frees_soon(running, self._cfg):
                # Its user already runs something there: it waits for that slot instead. A
                # user with nothing running never waits for it (the light user's case).
                continue
            victim = choose_victim(waiting, running, self._cfg)
            if victim is not None and (best is None or _better(victim, best[0])):
                assert isinstance(victim.key, Ticket)
                best = (victim, victim.key, backend, head)
        if best is None:
            return False
        victim, ticket, backend, head = best
        # In a cluster the slot stays claimed from the victim to ``head`` (never free between).
        self._attempts.hand_over(ticket, head)
        redone = self._preempt(ticket, backend, now, "tier" if victim.tier > tier else "fair-share")
        self._start_waiting(model, tier, head, backend, now, redone)
        head.lender = ticket
        return True

    def repay(self, now: float) -> None:
        """Start a preempted request in its slot again when the request that took it ends.

        The slot was lent: once the borrower's user has nothing more queued in its tier, the
        victim's continuation takes the slot back, ahead of the next pick, instead of waiting
        for its user's fairness turn (only the light request's run was taken from it; its
        prefix is still in the engine's cache, and continuations stay out of the flood's
        tail: ``docs/design/preemption.md``). A borrower whose user still has requests
        queued took the slot by fair standing, so the slot goes by the next pick as usual.
        """
        if not self._attempts.loans:  # every dispatch pass: nothing to allocate or walk
            return
        loans, self._attempts.loans = self._attempts.loans, []
        for victim, backend, borrower in loans:
            model = self._models.get(victim.request.model)
            if (
                victim.state is not TicketState.QUEUED
                or model is None
                or model.queue.tiers[borrower.tier].user_len(borrower.user)
                or backend not in self._backends.of(model.name)
                or not _serving(backend)
                or backend.id in victim.excluded
                or _slots_taken(backend)
            ):
                continue  # it waits for its turn like any other request
            model.queue.remove(victim, start=True)
            self._attempts.start(victim, backend, now)
            self._telemetry.preempt_repaid.labels(backend.id).inc()

    @property
    def _cfg(self) -> PreemptConfig:
        return self._settings().config.preempt

    def _full_backends(self, model: str) -> Iterator[BackendState]:
        """Yield the backends of ``model`` that allow preemption and have no free slot."""
        for backend in self._backends.of(model):
            if (
                backend.backend.preempt
                and backend.max_in_flight
                and _serving(backend)
                and _slots_taken(backend)
            ):
                yield backend

    @staticmethod
    def _candidates(backend: BackendState, tickets: Iterable[Ticket]) -> Iterator[Running]:
        for ticket in tickets:
            progress = ticket.progress
            if progress is None or not ticket.generating or ticket.carrier is not None:
                continue  # a carried request's bytes are not fairq's to stop and resume
            weight = ticket.weight
            adapter = backend.backend
            exempt = (
                progress.beside_text
                or exempt_reason(ticket.request, continues_chat=adapter.continues_chat)
                or short_of_room(
                    ticket.request,
                    progress,
                    adapter.context_lengths.get(ticket.request.model),
                    ticket.prompt_tokens,
                    by_ids=adapter.continues_by_ids,
                )
            )
            yield Running(
                key=ticket,
                tier=ticket.tier,
                standing=backend.user_in_flight.get(ticket.user, 0) / weight,
                step=1 / weight,
                generated=progress.tokens,
                remaining=ticket.tokens_left(progress.tokens),
                preemptions=progress.preemptions,
                seq=ticket.seq,
                exempt=bool(exempt),
                carried=progress.carried,
            )

    def _preempt(self, ticket: Ticket, backend: BackendState, now: float, reason: str) -> int:
        """Abort ``ticket`` on ``backend``, queue its continuation; return the prefill redone."""
        progress = ticket.progress
        assert progress is not None
        self._caps[backend.id].record(now)
        progress.preemptions += 1
        self._attempts.abort(ticket)  # closes the stream: the backend aborts the request
        read = progress.tokens
        resume = progress.resume()
        ticket.request = dataclasses.replace(ticket.request, resume=resume)
        ticket.generating = False
        t = self._telemetry
        t.preemptions.labels(backend.id, reason).inc()
        # Decoded again: what was read but is not carried (an incomplete character's bytes);
        # carried output is prefill, counted apart.
        t.preempt_regenerated.labels(backend.id).inc(read - resume.tokens)
        t.preempt_resumed.labels(backend.id).inc(resume.tokens)
        t.preempt_prefill.labels(backend.id).inc(ticket.prompt_tokens + resume.tokens)
        log.info(
            "preempted request %s on %s after %d tokens (%s)",
            ticket.request.request_id, backend.id, resume.tokens, reason,
        )  # fmt: skip
        redone = ticket.prompt_tokens + resume.tokens
        model = self._models.get(ticket.request.model)
        if model is None:  # cannot happen while its backend serves it; kept safe anyway
            error = NoBackendError(f"no backend serves model '{ticket.request.model}' any more")
            self._attempts.abandon(ticket, error)
            return redone
        # Among its user's requests, oldest first; never expired by the queue's TTL (its
        # caller is already reading its stream).
        model.resume(ticket, ttl=False)
        return redone

    def _start_waiting(
        self,
        model: ModelState,
        tier: int,
        head: Ticket,
        backend: BackendState,
        now: float,
        redone: int,
    ) -> None:
        """Start ``head`` in the freed slot; charge it the prefill it makes redone."""
        tier_queue = model.queue.tiers[tier]
        if tier_queue.has_retries and tier_queue.peek_retry() is head:
            ticket = model.queue.pop(tier)
        else:
            ticket = model.queue.pop(tier, head.user)
        assert ticket is head, "the head of the tier is what is started"
        model.last_served[tier] = now
        ticket.priority_tier = tier
        tier_queue.fairness.charge(ticket.user, Cost(prompt_tokens=redone), ticket.weight)
        self._attempts.start(ticket, backend, now)


def _waiting(model: ModelState, tier: int, backend: BackendState) -> Ticket | None:
    """Return the request of ``tier`` that should run now on ``backend``.

    A retry first (as in dispatch); else the next request of the queued user who holds least
    of the backend per unit of weight (ties: the user queued longest). That user is not
    always fairness's next pick (round-robin may be on another user's turn), but it is the one
    whose wait for a slot is least fair.
    """
    tier_queue = model.queue.tiers[tier]
    if tier_queue.has_retries:
        return tier_queue.peek_retry()
    best: tuple[float, Ticket] | None = None
    for user in itertools.islice(tier_queue.users(), MAX_USERS_COMPARED):
        head = tier_queue.head_of(user)
        standing = backend.user_in_flight.get(user, 0) / head.weight
        if best is None or standing < best[0]:
            best = (standing, head)
    return None if best is None else best[1]


def _serving(backend: BackendState) -> bool:
    """Whether ``backend`` may be sent work (not suspect or down, not draining)."""
    return backend.healthy is not False and not backend.draining


def _slots_taken(backend: BackendState) -> bool:
    """Whether every running slot of ``backend`` is taken (by any replica's requests)."""
    return backend.in_flight + backend.peer_in_flight >= backend.max_in_flight


def _better(a: Running, b: Running) -> bool:
    return rank(a) < rank(b)
