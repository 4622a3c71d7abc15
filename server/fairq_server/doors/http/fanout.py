"""A list of prompts, or ``n`` choices: each prompt and choice its own request, one answer.

OpenAI and vLLM take ``prompt`` as a list (LangChain's completions ``batch`` sends one) and
answer with a choice per prompt; ``n`` asks for several choices of each prompt (or of a
chat). vLLM runs each choice as a request of its own; fairq does the same, before the
engine: each prompt and choice gets its own ticket, charged to the caller, through the queue
and the gate like any other, so ``n`` choices take ``n`` backend slots and not one. What
comes back is joined: choice ``index`` is ``prompt * n + choice`` (OpenAI's numbering), the
usage is summed (each prompt's tokens counted once, as vLLM counts them for ``n``), and a
stream carries every choice's chunks as they come (each with its ``index``), one usage chunk
if asked for, and one ``[DONE]``.

No half answers: if one prompt fails (its backend fails before the first token and no retry
helps, the queue is full, the answer grows too large), the others are cancelled and the
caller gets that error (a stream that has begun gets it as an error event before its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from fairq_server.doors.access_log import RequestLog, RequestTrace
from fairq_server.doors.http.aggregate import ChunkMerger
from fairq_server.doors.http.answers import (
    answer_too_large,
    error_answer,
    error_json,
    parse_frames,
    prepare,
)
from fairq_server.doors.http.errors import HttpError, error_response
from fairq_server.doors.http.parse import ParsedRequest
from fairq_server.doors.http.sse import DONE, error_event
from fairq_server.doors.lifecycle import count_rejection, open_ticket, ticket_events
from fairq_server.errors import SchedulerError
from fairq_server.identity.auth import Principal
from fairq_server.port import CorePort, Submitted
from fairq_server.scheduling.outbox import OutboxEvent, Relayed, Started

__all__ = ["answer_batch"]

# What a pump hands over: a batch of events, the error that ended it, or None at its end.
_Item = tuple[int, list[OutboxEvent] | BaseException | None]


async def answer_batch(
    core: CorePort,
    request_log: RequestLog,
    request: web.Request,
    principal: Principal,
    parsed: ParsedRequest,
    arrival: float,
    not_found: Callable[[], HttpError],
) -> web.StreamResponse:
    """Schedule each prompt and choice of ``parsed.batch`` and answer with one response.

    Returns:
        the merged answer, the stream, or the first prompt's error.

    """
    retry_after = core.config.http.retry_after_seconds
    tier = request.headers.get("x-fairq-tier", "")
    bound = parsed.request.extra.get("max_completion_tokens")
    tickets: list[Submitted] = []
    streams: list[AsyncIterator[list[OutboxEvent]]] = []
    try:
        for each in parsed.batch:
            trace = RequestTrace(arrival=arrival)
            trace.request_id, trace.model = each.request_id, each.model
            trace.user, trace.group = principal.user, principal.group
            ticket = open_ticket(
                core,
                principal,
                # Usage always: the answer's is the sum of the prompts'.
                replace(each, relay_chunks=True, relay_usage=True),
                tier,
                arrival=arrival,
                max_tokens=bound if isinstance(bound, int) else None,
            )
            trace.tier = core.tier_names[ticket.tier]
            tickets.append(ticket)
            streams.append(ticket_events(core, ticket, _finished(request_log, trace), trace))
    except SchedulerError as exc:
        # A prompt refused at the door (a full queue): the ones already queued leave it.
        for ticket in tickets:
            core.cancel(ticket)
        count_rejection(core, exc)
        return error_answer(exc, retry_after, not_found)
    joined = _Joined(parsed.choices)
    request_id = parsed.request.request_id.rsplit("-", 1)[0]
    chat = parsed.kind == "chat"
    try:
        if parsed.stream:
            return await _stream(request, streams, joined, parsed.include_usage, request_id)
        return await _collect(core, streams, joined, request_id, chat)
    except SchedulerError as exc:
        answer = error_answer(exc, retry_after, not_found)
        answer.headers["x-request-id"] = request_id
        return answer
    except HttpError as exc:
        return error_response(exc, retry_after)
    except ConnectionResetError:
        return web.Response(status=499)  # the client left; every prompt is cancelled


def _finished(request_log: RequestLog, trace: RequestTrace) -> Callable[[str], None]:
    return lambda outcome: request_log.finished(trace, outcome)


class _Joined:
    """The parts of the one answer: its head, choice numbering and summed usage.

    Args:
        choices: ``n``, the requests of each prompt in the batch (prompt-major).

    """

    def __init__(self, choices: int) -> None:
        self.choices = choices
        self.head: dict[str, Any] | None = None
        self.usage: dict[str, int] = {}

    def take_head(self, chunk: dict[str, Any]) -> None:
        if self.head is None:
            self.head = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}

    def add_usage(self, position: int, usage: object) -> None:
        """Add the usage of the batch's request ``position``.

        A prompt's tokens are counted once, with its first choice: the engine computes a
        prompt shared by ``n`` choices once where its cache holds it, and vLLM counts it once.
        """
        if not isinstance(usage, dict):
            return
        counts = {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}
        if position % self.choices:
            prompt = counts.pop("prompt_tokens", 0)
            if "total_tokens" in counts:
                counts["total_tokens"] -= prompt
        for key, value in counts.items():
            self.usage[key] = self.usage.get(key, 0) + value

    def renumber(self, position: int, choices: list[Any]) -> list[Any]:
        """Return the choices of the batch's request ``position``, numbered as the answer's.

        Each request of the batch asks for one choice (``n`` is fairq's), so its engine
        numbers it 0 and its place in the batch, ``prompt * n + choice``, is its index.
        """
        out = []
        for choice in choices:
            if isinstance(choice, dict):
                index = choice.get("index", 0)
                index = index if isinstance(index, int) else 0
                choice = {**choice, "index": position + index}
            out.append(choice)
        return out


async def _pump(
    index: int, events: AsyncIterator[list[OutboxEvent]], queue: asyncio.Queue[_Item]
) -> None:
    """Hand one prompt's events to the joining loop; closing them cancels the prompt."""
    try:
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            async for batch in events:
                await queue.put((index, batch))
    except Exception as exc:  # the prompt's failure, reported by the joining loop
        await queue.put((index, exc))
        return
    await queue.put((index, None))


async def _joined_events(
    streams: list[AsyncIterator[list[OutboxEvent]]],
) -> AsyncIterator[tuple[int, list[OutboxEvent]]]:
    """Yield ``(prompt, events)`` from every prompt as they come, until all have finished.

    Raises:
        SchedulerError: a prompt failed; the others are cancelled first.

    """
    # Bounded: a slow caller holds the pumps, which leave the backends' text in the outboxes
    # (bounded by max_unread_chars), as for a single request.
    queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=len(streams))
    pumps = [asyncio.create_task(_pump(i, s, queue)) for i, s in enumerate(streams)]
    try:
        running = len(pumps)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _collect(
    core: CorePort,
    streams: list[AsyncIterator[list[OutboxEvent]]],
    joined: _Joined,
    request_id: str,
    chat: bool,
) -> web.Response:
    mergers = [ChunkMerger(chat) for _ in streams]
    sizes = [0] * len(streams)
    limit = core.config.http.max_answer_chars
    events = _joined_events(streams)
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        async for index, batch in events:
            for event in batch:
                if isinstance(event, Relayed):
                    sizes[index] += len(event.frames)
                    if sum(sizes) > limit:
                        raise answer_too_large(limit)
                    mergers[index].add(parse_frames(event.frames))
                elif isinstance(event, Started):
                    # A retry on another backend starts afresh.
                    mergers[index], sizes[index] = ChunkMerger(chat), 0
    choices: list[Any] = []
    for index, merger in enumerate(mergers):
        result = merger.result()
        joined.take_head(result)
        joined.add_usage(index, result.get("usage"))
        choices += joined.renumber(index, result.get("choices") or [])
    body = {**(joined.head or {}), "choices": choices, "usage": joined.usage}
    text = json.dumps(body, separators=(",", ":"))
    resp = web.Response(text=text, content_type="application/json")
    resp.headers["x-request-id"] = request_id
    return resp


async def _stream(
    request: web.Request,
    streams: list[AsyncIterator[list[OutboxEvent]]],
    joined: _Joined,
    include_usage: bool,
    request_id: str,
) -> web.StreamResponse:
    resp: web.StreamResponse | None = None
    events = _joined_events(streams)
    try:
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            async for index, batch in events:
                for event in batch:
                    if not isinstance(event, Relayed):
                        continue
                    out = _relabel(joined, index, parse_frames(event.frames))
                    if out:
                        # The response starts with the first text, so a failure before it
                        # still gets its own HTTP status.
                        resp = resp or await prepare(request, request_id)
                        await resp.write(out)
    except SchedulerError as exc:
        if resp is None:
            raise
        await resp.write(error_event(error_json(exc)))
        await resp.write_eof()
        return resp
    resp = resp or await prepare(request, request_id)
    if include_usage:
        last = {**(joined.head or {}), "choices": [], "usage": joined.usage}
        await resp.write(f"data: {json.dumps(last, separators=(',', ':'))}\n\n".encode())
    await resp.write(DONE)
    await resp.write_eof()
    return resp


def _relabel(joined: _Joined, index: int, chunks: list[dict[str, Any]]) -> bytes:
    """Return a request's chunks as the one answer's: its id, renumbered, usage held back."""
    frames = []
    for chunk in chunks:
        joined.take_head(chunk)
        choices = chunk.get("choices")
        if isinstance(chunk.get("usage"), dict) and not choices:
            joined.add_usage(index, chunk["usage"])  # summed, sent once at the end
            continue
        head = joined.head or {}
        chunk = {**chunk, "id": head.get("id"), "choices": joined.renumber(index, choices or [])}
        frames.append(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n")
    return "".join(frames).encode()
