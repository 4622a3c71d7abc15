"""One request's life in fairq, shared by both doors (gRPC and HTTP).

A door authenticates and parses; :func:`run_request` does the rest the same way for both:
resolve the tier, find the model's dispatcher, queue a :class:`Ticket`, wait for a backend,
open the stream (the door says how: text for gRPC, the backend's own chunks for HTTP),
report the first token and charge tokens, retry once on another backend if one fails before
its first token, settle the fairness account and release the ticket exactly once, whatever
happens (finished, failed, client gone). So a user's requests through either door share one
queue and one fairness account.

Events, in order: :class:`Queued`, then :class:`Started` (again after a retry), the stream's
:class:`~fairq_server.backends.base.TextDelta` events, and :class:`Finished`. Failures raise
:class:`~fairq_server.errors.SchedulerError`; the door translates them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from fairq_server.api.validation import estimate_tokens, resolve_tier
from fairq_server.auth import Principal
from fairq_server.backends.base import Backend, BackendRequest, StreamEnd, StreamEvent, TextDelta
from fairq_server.backends.registry import BackendEntry
from fairq_server.core import FairqCore
from fairq_server.errors import BackendError, SchedulerError, status_for
from fairq_server.scheduling.dispatcher import Dispatcher
from fairq_server.scheduling.prefix import prefix_hashes
from fairq_server.scheduling.ticket import Ticket

__all__ = ["EventStream", "Finished", "Queued", "Started", "StreamOpener", "run_request"]

log = logging.getLogger(__name__)

# Token charges are batched so a fast stream does not post one command per token.
_CHARGE_EVERY = 16
_MAX_RETRIES = 1


@dataclass(frozen=True)
class Queued:
    """The request is in the queue at ``position`` (0-based, an estimate)."""

    position: int


@dataclass(frozen=True)
class Started:
    """The request was forwarded to a backend."""

    backend_id: str
    queue_seconds: float
    tier: str
    request_id: str


@dataclass(frozen=True)
class Finished:
    """The backend finished the request normally."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    queue_seconds: float
    ttft_seconds: float
    total_seconds: float


Event = Queued | Started | TextDelta | Finished


class EventStream(Protocol):
    """A backend stream as a door reads it; ``aclose`` aborts the backend request."""

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        """Iterate the events."""
        ...

    async def aclose(self) -> None:
        """Stop reading and close the backend request."""
        ...


StreamOpener = Callable[[Backend, BackendRequest, int], EventStream]


async def run_request(
    core: FairqCore,
    principal: Principal,
    request: BackendRequest,
    requested_tier: str,
    open_stream: StreamOpener,
    *,
    arrival: float | None = None,
    max_tokens: int | None = None,
) -> AsyncIterator[Event]:
    """Queue ``request`` for ``principal`` and yield its lifecycle events.

    Args:
        core: the scheduling core.
        principal: the authenticated caller.
        request: the validated request.
        requested_tier: the tier asked for ("" for the caller's ceiling).
        open_stream: opens the backend stream for a backend and priority.
        arrival: monotonic arrival time (default: now).
        max_tokens: the output bound for cost estimates, if not ``request.sampling``'s.

    Raises:
        SchedulerError: rejected before queueing or evicted after; nothing else but
            ``asyncio.CancelledError`` escapes besides unexpected bugs.

    """
    arrival = time.monotonic() if arrival is None else arrival
    telemetry = core.telemetry
    tier_name = ""
    try:
        tier = resolve_tier(requested_tier, principal, core.tier_names)
        tier_name = core.tier_names[tier]
        dispatcher = core.dispatcher(request.model)
    except SchedulerError as exc:
        telemetry.requests.labels(tier_name or "none", _outcome(exc)).inc()
        raise
    ticket = Ticket(
        request=request,
        user=principal.user,
        tier=tier,
        weight=principal.weight,
        group=principal.group,
        prompt_tokens=estimate_tokens(request),
        max_tokens=max_tokens or request.sampling.max_tokens or 0,
        arrival=arrival,
        prefix=prefix_hashes(
            request.prompt, request.messages, core.config.scheduler.prefix_block_chars
        ),
    )
    dispatcher.submit(ticket)
    outcome = "cancelled"
    try:
        async for event in _serve(core, ticket, dispatcher, open_stream):
            yield event
        outcome = "finished"
    except SchedulerError as exc:
        outcome = _outcome(exc)
        code, message = status_for(exc)
        log.info("request %s ended: %s %s", request.request_id, code.name, message)
        raise
    finally:
        dispatcher.release(ticket)
        telemetry.requests.labels(tier_name, outcome).inc()


async def _serve(
    core: FairqCore, ticket: Ticket, dispatcher: Dispatcher, open_stream: StreamOpener
) -> AsyncIterator[Event]:
    telemetry = core.telemetry
    tier_cfg = core.config.tiers[ticket.tier]
    yield Queued(await ticket.enqueued)
    first_token_at: float | None = None
    while True:
        entry = await ticket.assigned
        # The backend request goes out before the client is told (where the opener starts
        # it at once), so requests dispatched in one pass reach the backend in order.
        stream = open_stream(entry.backend, ticket.request, _priority(core, ticket))
        queue_seconds = time.monotonic() - ticket.arrival
        # The queue charged the estimated prompt at dispatch (vtc); settled at the end.
        charged_prompt = ticket.prompt_tokens
        charged_completion = pending = 0
        try:
            async with contextlib.aclosing(stream):
                yield Started(
                    entry.backend.id, queue_seconds, tier_cfg.name, ticket.request.request_id
                )
                async for event in stream:
                    if isinstance(event, StreamEnd):
                        end = event
                        break
                    if first_token_at is None and event.tokens:
                        first_token_at = time.monotonic()
                        dispatcher.first_token(ticket)
                        telemetry.ttft.labels(tier_cfg.name).observe(
                            first_token_at - ticket.arrival
                        )
                    pending += event.tokens
                    if pending >= _CHARGE_EVERY:
                        dispatcher.charge(ticket, 0, pending)
                        charged_completion += pending
                        pending = 0
                    yield event
                else:
                    raise BackendError(
                        f"backend {entry.backend.id} ended the stream without finishing",
                        grpc.StatusCode.UNAVAILABLE,
                    )
        except BackendError as exc:
            if exc.retryable and first_token_at is None and ticket.retries < _MAX_RETRIES:
                log.warning("retrying request %s: %s", ticket.request.request_id, exc)
                ticket.assigned = _loop_future()
                dispatcher.retry(ticket)
                continue
            raise
        break
    # Settle the fairness account with the backend's own token counts.
    prompt_tokens = end.prompt_tokens or ticket.prompt_tokens
    completion_tokens = end.completion_tokens or (charged_completion + pending)
    dispatcher.charge(
        ticket, prompt_tokens - charged_prompt, completion_tokens - charged_completion
    )
    telemetry.tokens.labels(ticket.group, "prompt").inc(prompt_tokens)
    telemetry.tokens.labels(ticket.group, "completion").inc(completion_tokens)
    done_at = time.monotonic()
    yield Finished(
        finish_reason=end.finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        queue_seconds=queue_seconds,
        ttft_seconds=(first_token_at or done_at) - ticket.arrival,
        total_seconds=done_at - ticket.arrival,
    )


def _priority(core: FairqCore, ticket: Ticket) -> int:
    """Return the backend priority to send: the tier's, or the overtaken tier's if aged."""
    index = ticket.priority_tier if ticket.priority_tier is not None else ticket.tier
    cfg = core.config.tiers[index]
    return cfg.priority if cfg.priority is not None else index


def _loop_future() -> asyncio.Future[BackendEntry]:
    return asyncio.get_running_loop().create_future()


def _outcome(exc: SchedulerError) -> str:
    return status_for(exc)[0].name.lower()
