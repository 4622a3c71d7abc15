"""The HTTP door's request handlers: chat and completions (streamed or not), models.

Each request is authenticated like a gRPC call (the same keys; ``Authorization: Bearer``;
in open mode ``x-fairq-user`` or the body's ``user``), parsed (:mod:`.parse`), and then run
through the lifecycle both doors share (:mod:`fairq_server.doors.lifecycle`): one queue
and one fairness account per user whichever door a request comes through. Its backend stream is
read in relay mode (``BackendRequest.relay_chunks``): the outbox carries the backend's own
chunks, framed as server-sent events, which are written as they are.

Streaming answers start (HTTP 200) only with the first backend chunk, so an error before
it (queue full, queue timeout, the backend refusing the request) still gets its own HTTP
status; a caller that asked for queue events (``x-fairq-queue-events: true``) gets the 200 at
once and SSE comments while queued. A client that disconnects is cancelled like a cancelled
gRPC call: aiohttp cancels the handler, which removes the ticket from the queue or closes the
backend stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from fairq_server.config.schema import Config
from fairq_server.doors.access_log import RequestLog, RequestTrace
from fairq_server.doors.http import json_body
from fairq_server.doors.http.aggregate import ChunkMerger
from fairq_server.doors.http.answers import (
    answer_too_large,
    error_answer,
    error_json,
    parse_frames,
    prepare,
)
from fairq_server.doors.http.errors import HttpError, error_for, error_response
from fairq_server.doors.http.fanout import answer_batch
from fairq_server.doors.http.parse import Kind, ParsedRequest, parse_request
from fairq_server.doors.http.sse import DONE, comment, error_event
from fairq_server.doors.lifecycle import (
    DoorBase,
    count_rejection,
    open_ticket,
    ticket_events,
)
from fairq_server.errors import SchedulerError
from fairq_server.identity.auth import Authenticator, Principal
from fairq_server.port import CorePort
from fairq_server.scheduling.outbox import Finished, OutboxEvent, Queued, Relayed, Started

__all__ = ["OpenAIHandlers"]

log = logging.getLogger(__name__)

_TRUE = frozenset({"1", "true", "yes", "on"})


class OpenAIHandlers(DoorBase):
    """The door's request handlers over one core (its port) and one :class:`Authenticator`."""

    def __init__(
        self, core: CorePort, auth: Authenticator, request_log: RequestLog | None = None
    ) -> None:
        super().__init__(core, auth, request_log)
        self._created = int(time.time())

    # -- routes ---------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        return await self._generate(request, "completion")

    async def models(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models``: the models served now, if the caller may use any tier."""
        try:
            principal = await self._authenticate(request, None)
        except SchedulerError as exc:
            return error_response(error_for(exc), self._core.config.http.retry_after_seconds)
        data = [self._model(m) for m in self._models_for(principal)]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/models/{id}``: one model served here (``client.models.retrieve``)."""
        try:
            principal = await self._authenticate(request, None)
        except SchedulerError as exc:
            return error_response(error_for(exc), self._core.config.http.retry_after_seconds)
        name = request.match_info["model"]
        if name not in self._models_for(principal):
            return error_response(_model_not_found(name, self._models_for(principal)))
        return web.json_response(self._model(name))

    def _models_for(self, principal: Principal) -> list[str]:
        """Return the models served now if ``principal`` may use any tier, else none.

        Only models a backend serves (:meth:`~fairq_server.port.CorePort.served_models`):
        a model registered for a backend that is down, or that does not list it, would be
        offered and then refused with 503 on every request.
        """
        if not principal.tiers & set(self._core.tier_names):
            return []
        return sorted(self._core.served_models())

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self._created, "owned_by": "fairq"}

    # -- the generation path --------------------------------------------------------------

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        arrival = time.monotonic()
        config = self._core.config
        retry_after = config.http.retry_after_seconds
        trace = RequestTrace(arrival=arrival)
        try:
            principal = None if self._auth.open_mode else await self._authenticate(request, None)
            parsed = parse_request(await _read_json(request, config), kind, config.limits)
            trace.request_id, trace.model = parsed.request.request_id, parsed.request.model
            if principal is None:
                principal = await self._authenticate(request, parsed.user)
            if parsed.batch:
                caller = principal
                return await answer_batch(
                    self._core,
                    self._request_log,
                    request,
                    principal,
                    parsed,
                    arrival,
                    lambda: _model_not_found(parsed.request.model, self._models_for(caller)),
                )
            backend_request = replace(
                parsed.request,
                relay_chunks=True,
                # A merged answer always carries usage; a stream only if the caller asked.
                relay_usage=parsed.include_usage or not parsed.stream,
            )
            ticket = open_ticket(
                self._core,
                principal,
                backend_request,
                request.headers.get("x-fairq-tier", ""),
                arrival=arrival,
                max_tokens=_output_bound(parsed),
            )
        except HttpError as exc:
            return _closing(error_response(exc, retry_after))
        except SchedulerError as exc:
            count_rejection(self._core, exc)
            self._request_log.finished(trace, exc.outcome)
            return error_response(error_for(exc), retry_after)
        trace.user, trace.group, trace.team = principal.user, principal.group, principal.team
        trace.tier = self._core.tier_names[ticket.tier]
        events = ticket_events(
            self._core,
            ticket,
            on_end=lambda outcome: self._request_log.finished(trace, outcome),
            trace=trace,
        )
        request_id = backend_request.request_id
        caller = principal

        def not_found() -> HttpError:
            return _model_not_found(parsed.request.model, self._models_for(caller))

        try:
            if parsed.stream:
                return await self._stream(request, events, retry_after, request_id, not_found)
            resp = await self._collect(parsed, events, retry_after, not_found)
            resp.headers["x-request-id"] = request_id
            return resp
        except ConnectionResetError:
            # The client went away while fairq wrote to it: the ticket is cancelled already.
            return web.Response(status=499)

    async def _authenticate(self, request: web.Request, body_user: str | None) -> Principal:
        headers = [(k.lower(), v) for k, v in request.headers.items()]
        if self._auth.open_mode and body_user and "x-fairq-user" not in request.headers:
            headers.append(("x-fairq-user", body_user))
        return await self._auth.authenticate(headers)

    async def _collect(
        self,
        parsed: ParsedRequest,
        events: AsyncIterator[list[OutboxEvent]],
        retry_after: int,
        not_found: Callable[[], HttpError],
    ) -> web.StreamResponse:
        chat = parsed.kind == "chat"
        merger = ChunkMerger(chat)
        limit = self._core.config.http.max_answer_chars
        size = 0
        try:
            # Leaving this block for any reason closes the events, which cancels the ticket
            # and aborts the backend request.
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for batch in events:
                    for event in batch:
                        if isinstance(event, Relayed):
                            size += len(event.frames)
                            if size > limit:
                                raise answer_too_large(limit)
                            # Merged as it comes: a batch's parse is short, one at the end
                            # of a long answer would stall the loop.
                            merger.add(parse_frames(event.frames))
                        elif isinstance(event, Started):
                            # A retry on another backend starts afresh.
                            merger, size = ChunkMerger(chat), 0
        except SchedulerError as exc:
            return error_answer(exc, retry_after, not_found)
        except HttpError as exc:
            return error_response(exc, retry_after)
        body = json.dumps(merger.result(), separators=(",", ":"))
        return web.Response(text=body, content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        events: AsyncIterator[list[OutboxEvent]],
        retry_after: int,
        request_id: str,
        not_found: Callable[[], HttpError],
    ) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        want_comments = request.headers.get("x-fairq-queue-events", "").lower() in _TRUE
        keepalive: asyncio.Task[None] | None = None
        # A batch's chunks (and the closing [DONE]) go out in one write: each write is a
        # system call and a task step, and the last one rides with the end of the body
        # (inside the events' block, so a caller gone by then still cancels the ticket).
        tail = b""
        urgent = True
        try:
            async with contextlib.aclosing(events):  # type: ignore[type-var]
                async for batch in events:
                    out: list[bytes] = []
                    for event in batch:
                        if isinstance(event, Relayed):
                            # The backend's chunks, already framed as server-sent events. The
                            # response starts with the first of them, so a failure before it
                            # still gets its own HTTP status.
                            out.append(event.frames.encode())
                        elif isinstance(event, Finished):
                            out.append(DONE)
                        elif isinstance(event, Queued):
                            if want_comments:
                                resp = resp or await prepare(request, request_id)
                                await _flush(resp, out)
                                await resp.write(comment(f"fairq queued position={event.position}"))
                                interval = self._core.config.http.queue_comment_seconds
                                keepalive = asyncio.create_task(_keepalive(resp, interval))
                        elif isinstance(event, Started):
                            if keepalive is not None:
                                keepalive.cancel()
                                await asyncio.gather(keepalive, return_exceptions=True)
                                keepalive = None
                            if resp is not None:
                                await _flush(resp, out)
                                await resp.write(
                                    comment(
                                        f"fairq started backend={event.backend_id} "
                                        f"queue_seconds={event.queue_seconds:.3f}"
                                    )
                                )
                    if not out:
                        continue
                    resp = resp or await prepare(request, request_id)
                    # Writing to clients is bulk work (see runtime/loop_share); the first write,
                    # which carries the first token, an urgent turn.
                    await self._turn(urgent)
                    urgent = False
                    if out[-1] is DONE:  # the last batch: written with the end of the body
                        await resp.write_eof(b"".join(out))
                    else:
                        await resp.write(b"".join(out))
        except SchedulerError as exc:
            if resp is None:
                answer = error_answer(exc, retry_after, not_found)
                answer.headers["x-request-id"] = request_id
                return answer
            tail = error_event(error_json(exc))
        finally:
            if keepalive is not None:
                keepalive.cancel()
        assert resp is not None
        await resp.write_eof(tail)
        return resp


def _model_not_found(name: str, served: list[str]) -> HttpError:
    shown = ", ".join(served[:50]) + (f" (and {len(served) - 50} more)" if len(served) > 50 else "")
    return HttpError(
        404,
        f"The model '{name[:256]}' does not exist here; models served: {shown or 'none'}",
        "invalid_request_error",
        param="model",
        code="model_not_found",
    )


def _output_bound(parsed: ParsedRequest) -> int | None:
    value = parsed.request.extra.get("max_completion_tokens")
    return value if isinstance(value, int) else None


async def _flush(resp: web.StreamResponse, out: list[bytes]) -> None:
    """Write the chunks gathered so far (before a comment that follows them)."""
    if out:
        await resp.write(b"".join(out))
        out.clear()


async def _keepalive(resp: web.StreamResponse, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)  # a keep-alive cadence, not a synchronisation wait
        await resp.write(comment("fairq queued"))


async def _read_json(request: web.Request, config: Config) -> object:
    """Read the body within the size and time limits and parse it.

    Raises:
        HttpError: 413 (too large), 408 (too slow), 400 (not JSON).

    """
    limit = config.limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise HttpError(413, f"the request body is larger than {limit} bytes", code="too_large")
    chunks: list[bytes] = []
    size = 0
    timeout = config.http.body_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise HttpError(
                        413, f"the request body is larger than {limit} bytes", code="too_large"
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise HttpError(
            408, f"the request body did not arrive within {timeout:g} s", code="body_timeout"
        ) from None
    try:
        # A large body is parsed in slices, letting other requests run between them.
        return await json_body.loads(b"".join(chunks))
    except RecursionError:
        raise HttpError(400, "the request body is nested too deeply") from None
    except ValueError as exc:
        raise HttpError(400, f"the request body is not valid JSON: {exc}") from None


def _closing(resp: web.Response) -> web.Response:
    """Close the connection after an answer sent before the body was read to its end."""
    resp.force_close()
    return resp
