"""The ``fairq.v1.Scheduler`` servicer: translate a request into a ticket, relay its events.

The servicer decides nothing about scheduling: it authenticates and validates, then runs the
request through the lifecycle both doors share (:mod:`fairq_server.doors.lifecycle`:
submit a ticket, relay its outbox, cancel it whatever way the call ends) and turns the
outbox's events into response messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import grpc
from google.protobuf import struct_pb2

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.doors.access_log import RequestTrace
from fairq_server.doors.grpc.status import status_for, trailers_for
from fairq_server.doors.grpc.validation import models_hint, to_backend_request
from fairq_server.doors.lifecycle import (
    DoorBase,
    count_rejection,
    open_ticket,
    ticket_events,
)
from fairq_server.errors import ModelNotFoundError, SchedulerError
from fairq_server.scheduling.outbox import Finished, OutboxEvent, Queued, Relayed, Started, Text

__all__ = ["SchedulerServicer"]

log = logging.getLogger(__name__)

Response = scheduler_pb2.GenerateResponse


class SchedulerServicer(DoorBase, scheduler_pb2_grpc.SchedulerServicer):
    """Serves ``Generate``: authenticate, validate, queue, stream."""

    async def Generate(
        self,
        request: scheduler_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[scheduler_pb2.GenerateRequest, Response],
    ) -> AsyncIterator[Response]:
        """Queue one request and stream its lifecycle events."""
        arrival = time.monotonic()
        trace = RequestTrace(request_id=request.request_id[:256], model=request.model[:256],
                             arrival=arrival)  # fmt: skip
        try:
            principal = await self._auth.authenticate(context.invocation_metadata() or ())
            backend_request = to_backend_request(request, self._core.config.limits)
            ticket = open_ticket(
                self._core, principal, backend_request, request.tier, arrival=arrival
            )
        except SchedulerError as exc:
            count_rejection(self._core, exc)
            self._request_log.finished(trace, exc.outcome)
            await context.abort(*status_for(exc), trailing_metadata=trailers_for(exc))
        trace.request_id, trace.user, trace.group = (
            backend_request.request_id, principal.user, principal.group
        )  # fmt: skip
        trace.team = principal.team
        trace.tier = self._core.tier_names[ticket.tier]
        urgent = True
        try:
            async for events in ticket_events(
                self._core,
                ticket,
                on_end=lambda outcome: self._request_log.finished(trace, outcome),
                trace=trace,
            ):
                for event in events:
                    # Writing to the client is bulk work: the tokens of all streams on a
                    # backend arrive in the same engine step (see runtime/loop_share). Up to the
                    # first text, urgent turns: the time to first token waits for them.
                    await self._turn(urgent)
                    urgent = urgent and not isinstance(event, Text)
                    yield _response(event, backend_request.request_id)
        except SchedulerError as exc:
            code, message = status_for(exc)
            if isinstance(exc, ModelNotFoundError) and principal.admin:
                # Which models exist is told only to callers allowed to manage them.
                message += models_hint(self._core.known_models())
            await context.abort(code, message, trailing_metadata=trailers_for(exc))
        except Exception:
            # A bug or an unforeseen backend answer: the caller learns only that it failed
            # (nothing of the exception); ticket_events has logged the trace once.
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")


def _response(event: OutboxEvent, request_id: str) -> Response:
    match event:
        case Text():
            return Response(chunk=chunk_message(event))
        case Relayed():  # only for requests that relay the backend's chunks: never here
            raise TypeError("a gRPC request was given relayed chunks")
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


def chunk_message(delta: Text) -> scheduler_pb2.Chunk:
    """Return the gRPC chunk of ``delta``: its text, and what came beside it in ``extra``."""
    if not delta.extra:
        return scheduler_pb2.Chunk(text=delta.text)
    extra = struct_pb2.Struct()
    extra.update({"choices": [dict(e) for e in delta.extra]})
    return scheduler_pb2.Chunk(text=delta.text, extra=extra)
