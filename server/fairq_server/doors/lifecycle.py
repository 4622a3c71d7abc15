"""One request's life in fairq, shared by both doors (gRPC and HTTP).

A door authenticates and parses; then both do the same: :func:`open_ticket` resolves the tier
and submits a :class:`~fairq_server.scheduling.ticket.Ticket` to the dispatcher, and
:func:`ticket_events` relays what arrives in its outbox until the request finishes or fails,
cancels the ticket whatever way the caller leaves (harmless once it is done) and counts the
outcome. So a user's requests through either door share one queue, one set of caps and one
fairness account; only the translation to the wire differs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

from fairq_server.backends.request import BackendRequest
from fairq_server.doors.access_log import RequestLog, RequestTrace
from fairq_server.doors.estimate import estimate_tokens
from fairq_server.doors.tier import resolve_tier
from fairq_server.errors import InvalidRequestError, SchedulerError
from fairq_server.identity.auth import Authenticator, Principal
from fairq_server.port import CorePort, Submission, Submitted
from fairq_server.scheduling.outbox import Finished, OutboxEvent
from fairq_server.scheduling.prefix import prefix_hashes
from fairq_server.tenancy.teams import team_weights

__all__ = [
    "DoorBase",
    "check_token_prompt",
    "count_rejection",
    "describe_request",
    "open_ticket",
    "ticket_events",
]

log = logging.getLogger(__name__)


class DoorBase:
    """What each door's request handlers hold: the core, the authenticator, the access log.

    Args:
        core: the process's scheduling core.
        auth: the authenticator both doors share.
        request_log: where finished requests are logged (a fresh one if not given).

    """

    def __init__(
        self, core: CorePort, auth: Authenticator, request_log: RequestLog | None = None
    ) -> None:
        self._core = core
        # Writing to callers is bulk work: turns on the loop's share, bound once (per token).
        self._turn = core.tools.share.turn
        self._auth = auth
        self._request_log = request_log if request_log is not None else RequestLog()


def count_rejection(core: CorePort, exc: SchedulerError) -> None:
    """Count a request refused before it was queued (unauthenticated, invalid, bad tier)."""
    core.telemetry.requests.labels("none", exc.outcome).inc()


def open_ticket(
    core: CorePort,
    principal: Principal,
    request: BackendRequest,
    requested_tier: str,
    *,
    arrival: float | None = None,
    max_tokens: int | None = None,
) -> Submitted:
    """Resolve the tier, describe ``request`` and submit it to the core.

    Raises:
        SchedulerError: as :func:`describe_request`.

    """
    return core.submit(
        describe_request(
            core, principal, request, requested_tier, arrival=arrival, max_tokens=max_tokens
        )
    )


def describe_request(
    core: CorePort,
    principal: Principal,
    request: BackendRequest,
    requested_tier: str,
    *,
    arrival: float | None = None,
    max_tokens: int | None = None,
) -> Submission:
    """Resolve the tier and team of ``request`` for ``principal``, checked, as a submission.

    Args:
        core: the scheduling core.
        principal: the authenticated caller.
        request: the validated request.
        requested_tier: the tier asked for ("" for the caller's ceiling).
        arrival: monotonic arrival time (default: now).
        max_tokens: the output bound for cost estimates, if not ``request.sampling``'s.

    Raises:
        SchedulerError: unknown tier or one above the caller's ceiling, or a token-id
            prompt for a model whose backends do not all take them, or a hard quota or
            budget of the caller already reached.

    """
    config = core.config
    check_token_prompt(core, request)
    tier = resolve_tier(requested_tier, principal, core.tier_names)
    team, team_weight = team_weights(config.teams).resolve(principal.team)
    refused = core.refusal(principal.user, team, request.model)
    if refused is not None:
        raise refused
    return Submission(
        request=request,
        user=principal.user,
        tier=tier,
        weight=principal.weight,
        team=team,
        team_weight=team_weight,
        group=principal.group,
        prompt_tokens=estimate_tokens(request),
        max_tokens=max_tokens or request.sampling.max_tokens or 0,
        arrival=time.monotonic() if arrival is None else arrival,
        prefix=prefix_hashes(
            request.prompt,
            request.messages,
            config.scheduler.prefix_block_chars,
            token_ids=request.prompt_token_ids,
        ),
    )


def check_token_prompt(core: CorePort, request: BackendRequest) -> None:
    """Refuse a token-id prompt for a model a backend serves that does not take them.

    Every backend of the model must take them: the dispatcher may pick any of them.

    Raises:
        InvalidRequestError: naming the backend kinds that do not.

    """
    if request.prompt_token_ids is None:
        return
    refusing = core.token_prompt_refusers(request.model)
    if refusing:
        raise InvalidRequestError(
            f"this model's backends do not take token-id prompts ({', '.join(refusing)}); "
            "send the prompt as text"
        )


async def ticket_events(
    core: CorePort,
    ticket: Submitted,
    on_end: Callable[[str], None] = lambda outcome: None,
    trace: RequestTrace | None = None,
) -> AsyncIterator[list[OutboxEvent]]:
    """Yield the ticket's outbox events, a batch per take, until it finishes.

    The ticket is cancelled when the caller stops iterating for any reason (the request
    leaves the queue, or its backend request is aborted), the outcome is counted, and
    ``on_end`` is told it (``finished``, ``cancelled``, ``internal`` or the error's
    :attr:`~fairq_server.errors.SchedulerError.outcome`). ``trace``, if given, observes every
    event (for the request log).

    Raises:
        SchedulerError: the request failed (after the events before the failure).

    """
    tier_name = core.tier_names[ticket.tier]
    outcome = "cancelled"
    try:
        finished = False
        while not finished:
            events = await ticket.outbox.take()
            finished = any(isinstance(e, Finished) for e in events)
            if trace is not None:
                now = time.monotonic()
                for event in events:
                    trace.observe(event, now)
            yield events
        outcome = "finished"
    except SchedulerError as exc:
        outcome = exc.outcome
        log.info("request %s ended: %s %s", ticket.request.request_id, outcome, exc)
        raise
    except Exception:
        # A bug or an unforeseen backend answer: logged once, here; the door tells the
        # caller only that it failed (nothing of the exception).
        outcome = "internal"
        log.exception("request %s failed", ticket.request.request_id)
        raise
    finally:
        core.cancel(ticket)
        core.telemetry.requests_of(tier_name, outcome).inc()
        on_end(outcome)
