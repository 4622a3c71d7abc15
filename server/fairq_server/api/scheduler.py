"""The ``fairq.v1.Scheduler`` servicer: queue a request, then relay its backend stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server import loop_share
from fairq_server.api.validation import estimate_tokens, resolve_tier, to_backend_request
from fairq_server.auth import Authenticator
from fairq_server.backends.base import StreamEnd
from fairq_server.backends.registry import BackendEntry
from fairq_server.backends.relay import Relay
from fairq_server.core import FairqCore
from fairq_server.errors import BackendError, SchedulerError, status_for
from fairq_server.scheduling.dispatcher import Dispatcher
from fairq_server.scheduling.prefix import prefix_hashes
from fairq_server.scheduling.ticket import Ticket

__all__ = ["SchedulerServicer"]

log = logging.getLogger(__name__)

# Token charges are batched so a fast stream does not post one command per token.
_CHARGE_EVERY = 16
_MAX_RETRIES = 1

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
        tier_name = ""
        try:
            principal = self._auth.authenticate(context.invocation_metadata() or ())
            backend_request = to_backend_request(request, config.limits)
            tier = resolve_tier(request.tier, principal, self._core.tier_names)
            tier_name = self._core.tier_names[tier]
            dispatcher = self._core.dispatcher(request.model)
        except SchedulerError as exc:
            self._core.telemetry.requests.labels(tier_name or "none", _outcome(exc)).inc()
            code, message = status_for(exc)
            await context.abort(code, message)
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
        )
        dispatcher.submit(ticket)
        outcome = "cancelled"
        try:
            async for event in self._serve(ticket, dispatcher):
                # Writing to the client is bulk work: the tokens of all streams on a backend
                # arrive in the same engine step (see loop_share).
                await loop_share.turn()
                yield event
            outcome = "finished"
        except SchedulerError as exc:
            outcome = _outcome(exc)
            code, message = status_for(exc)
            log.info("request %s ended: %s %s", backend_request.request_id, code.name, message)
            await context.abort(code, message)
        finally:
            dispatcher.release(ticket)
            self._core.telemetry.requests.labels(tier_name, outcome).inc()

    async def _serve(self, ticket: Ticket, dispatcher: Dispatcher) -> AsyncIterator[Response]:
        telemetry = self._core.telemetry
        tier_cfg = self._core.config.tiers[ticket.tier]
        position = await ticket.enqueued
        yield Response(queued=scheduler_pb2.Queued(position=position))
        first_token_at: float | None = None
        while True:
            entry = await ticket.assigned
            # The backend request goes out before the client is told, so requests dispatched
            # in one pass reach the backend in dispatch order (the client writes may finish
            # in any order); behind a backend queue, that order is who gets the next slot.
            relay = Relay(
                entry.backend.stream(ticket.request, self._priority(ticket)),
                self._core.config.scheduler.stream_coalesce_seconds,
            )
            queue_seconds = time.monotonic() - ticket.arrival
            # The queue charged the estimated prompt at dispatch (vtc); settled at the end.
            charged_prompt = ticket.prompt_tokens
            charged_completion = pending = 0
            try:
                async with contextlib.aclosing(relay):
                    yield Response(
                        started=scheduler_pb2.Started(
                            backend_id=entry.backend.id,
                            queue_seconds=queue_seconds,
                            tier=tier_cfg.name,
                            request_id=ticket.request.request_id,
                        )
                    )
                    async for event in relay:
                        if isinstance(event, StreamEnd):
                            end = event
                            break
                        if first_token_at is None:
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
                        yield Response(chunk=scheduler_pb2.Chunk(text=event.text))
                    else:
                        raise BackendError(
                            f"backend {entry.backend.id} ended the stream without finishing",
                            grpc.StatusCode.UNAVAILABLE,
                        )
            except BackendError as exc:
                if exc.retryable and first_token_at is None and ticket.retries < _MAX_RETRIES:
                    log.warning("retrying request %s: %s", ticket.request.request_id, exc)
                    ticket.assigned = self._loop_future()
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
        yield Response(
            finished=scheduler_pb2.Finished(
                finish_reason=end.finish_reason,
                usage=scheduler_pb2.Usage(
                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
                ),
                timings=scheduler_pb2.Timings(
                    queue_seconds=queue_seconds,
                    ttft_seconds=(first_token_at or done_at) - ticket.arrival,
                    total_seconds=done_at - ticket.arrival,
                ),
            )
        )

    def _priority(self, ticket: Ticket) -> int:
        """Return the backend priority to send: the tier's, or the overtaken tier's if aged."""
        index = ticket.priority_tier if ticket.priority_tier is not None else ticket.tier
        cfg = self._core.config.tiers[index]
        return cfg.priority if cfg.priority is not None else index

    @staticmethod
    def _loop_future() -> asyncio.Future[BackendEntry]:
        return asyncio.get_running_loop().create_future()


def _outcome(exc: SchedulerError) -> str:
    return status_for(exc)[0].name.lower()
