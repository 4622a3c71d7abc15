"""The ``fairq.v1.Scheduler`` servicer: translate a request into a ticket, relay its events.

The servicer decides nothing about scheduling: it authenticates and validates, submits a
ticket to the dispatcher, and turns what arrives in the ticket's outbox into response
messages. Whatever way the call ends, it cancels the ticket (harmless once it is done).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server import loop_share
from fairq_server.api.validation import (
    estimate_tokens,
    models_hint,
    resolve_tier,
    to_backend_request,
)
from fairq_server.auth import Authenticator
from fairq_server.core import FairqCore
from fairq_server.errors import ModelNotFoundError, SchedulerError, status_for
from fairq_server.scheduling.outbox import Finished, Outbox, OutboxEvent, Queued, Started, Text
from fairq_server.scheduling.prefix import prefix_hashes
from fairq_server.scheduling.ticket import Ticket

__all__ = ["SchedulerServicer"]

log = logging.getLogger(__name__)

Response = scheduler_pb2.GenerateResponse


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    """Serves ``Generate``: authenticate, validate, queue, stream."""

    def __init__(self, core: FairqCore, auth: Authenticator) -> None:
        self._core = core
        self._auth = auth

    async def Generate(
        self,
        request: scheduler_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[scheduler_pb2.GenerateRequest, Response],
    ) -> AsyncIterator[Response]:
        """Queue one request and stream its lifecycle events."""
        arrival = time.monotonic()
        config = self._core.config
        telemetry = self._core.telemetry
        tier_name = ""
        try:
            principal = self._auth.authenticate(context.invocation_metadata() or ())
            backend_request = to_backend_request(request, config.limits)
            tier = resolve_tier(request.tier, principal, self._core.tier_names)
            tier_name = self._core.tier_names[tier]
        except SchedulerError as exc:
            telemetry.requests.labels(tier_name or "none", _outcome(exc)).inc()
            await context.abort(*status_for(exc))
        ticket = Ticket(
            request=backend_request,
            user=principal.user,
            tier=tier,
            weight=principal.weight,
            group=principal.group,
            prompt_tokens=estimate_tokens(backend_request),
            max_tokens=backend_request.sampling.max_tokens or 0,
            arrival=arrival,
            prefix=prefix_hashes(
                backend_request.prompt,
                backend_request.messages,
                config.scheduler.prefix_block_chars,
            ),
            outbox=Outbox(config.limits.max_unread_chars, config.scheduler.stream_coalesce_seconds),
        )
        dispatcher = self._core.dispatcher
        dispatcher.submit(ticket)
        outcome = "cancelled"
        try:
            finished = False
            while not finished:
                for event in await ticket.outbox.take():
                    # Writing to the client is bulk work: the tokens of all streams on a
                    # backend arrive in the same engine step (see loop_share).
                    await loop_share.turn()
                    yield _response(event, backend_request.request_id)
                    finished = isinstance(event, Finished)
            outcome = "finished"
        except SchedulerError as exc:
            outcome = _outcome(exc)
            code, message = status_for(exc)
            if isinstance(exc, ModelNotFoundError) and principal.admin:
                # Which models exist is told only to callers allowed to manage them.
                message += models_hint(dispatcher.models())
            log.info("request %s ended: %s %s", backend_request.request_id, code.name, message)
            await context.abort(code, message)
        except Exception:
            # A bug or an unforeseen backend answer: the caller learns only that it failed
            # (nothing of the exception); the trace is logged once, here.
            outcome = "internal"
            log.exception("request %s failed", backend_request.request_id)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        finally:
            dispatcher.cancel(ticket)
            telemetry.requests.labels(tier_name, outcome).inc()


def _response(event: OutboxEvent, request_id: str) -> Response:
    match event:
        case Text(text):
            return Response(chunk=scheduler_pb2.Chunk(text=text))
        case Queued(position):
            return Response(queued=scheduler_pb2.Queued(position=position))
        case Started(backend_id, queue_seconds, tier):
            return Response(
                started=scheduler_pb2.Started(
                    backend_id=backend_id,
                    queue_seconds=queue_seconds,
                    tier=tier,
                    request_id=request_id,
                )
            )
        case Finished():
            return Response(
                finished=scheduler_pb2.Finished(
                    finish_reason=event.end.finish_reason,
                    usage=scheduler_pb2.Usage(
                        prompt_tokens=event.prompt_tokens,
                        completion_tokens=event.completion_tokens,
                    ),
                    timings=scheduler_pb2.Timings(
                        queue_seconds=event.queue_seconds,
                        ttft_seconds=event.ttft_seconds,
                        total_seconds=event.total_seconds,
                    ),
                )
            )


def _outcome(exc: SchedulerError) -> str:
    return status_for(exc)[0].name.lower()
