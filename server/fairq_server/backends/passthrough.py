"""A backend's OpenAI stream relayed as it is, for the HTTP door.

The gRPC door turns a backend's stream into text (:meth:`Backend.stream`). The HTTP door
answers in the backend's own format, so for its requests (``BackendRequest.relay_chunks``)
the adapters hand over the chunks themselves: each ``data:`` payload is forwarded as
received, already framed as a server-sent event, in :attr:`TextDelta.text`. The payload is
parsed once only to see what fairq must know (tokens for the first-token event and the
fairness charge, the finish reason, usage) and to rewrite the one field fairq may have to:
``model``, when the backend names its model differently from the name the caller asked for.
The usage chunk fairq asks for is dropped unless the caller asked for it too
(``BackendRequest.relay_usage``). Every payload is bounded by the SSE reader's limit.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fairq_server.backends.base import Backend
from fairq_server.backends.continuation import relay_payload
from fairq_server.backends.http_reading import (
    http_error,
    posted,
    read_at_most,
    sse_reads,
    stream_failures,
    usage_tokens,
)
from fairq_server.backends.openai_wire import STREAM_HEADERS, json_body
from fairq_server.backends.request import BackendRequest, StreamEvent, TextDelta
from fairq_server.errors import BackendError

__all__ = ["BackendHttpError", "RawDelta", "openai_stream"]

_OUTPUT_KEYS = ("content", "tool_calls", "reasoning_content", "reasoning", "refusal")


class BackendHttpError(BackendError):
    """The backend refused the request with an HTTP error before streaming.

    Attributes:
        status: the backend's HTTP status.
        body: its answer (at most ``read_limits.error_bytes``; a longer one is cut there),
            for the HTTP door to pass on unchanged.
        content_type: the answer's content type.

    """

    def __init__(self, error: BackendError, status: int, body: bytes, content_type: str) -> None:
        super().__init__(str(error), error.kind, retryable=error.retryable)
        self.status = status
        self.body = body
        self.content_type = content_type


@dataclass(frozen=True)
class RawDelta(TextDelta):
    """Chunks of one network read: ``text`` is them framed as SSE, ``objects`` parsed."""

    objects: tuple[Mapping[str, Any], ...] = ()


def _read_choices(obj: Mapping[str, Any]) -> tuple[int, str]:
    """Count a chunk's choices that carry generated output (a token each, or more); its finish.

    The finish is the last finish reason a choice gives ("" if none does).
    """
    n = 0
    finish = ""
    for choice in obj.get("choices") or ():
        if choice.get("finish_reason"):
            finish = str(choice["finish_reason"])
        delta = choice.get("delta")
        # A dict, not the Mapping ABC: the JSON decoder makes dicts, and an ABC's isinstance
        # costs as much as the rest of this function per event.
        if isinstance(delta, dict):
            if any(delta.get(k) for k in _OUTPUT_KEYS):
                n += 1
        elif choice.get("text"):
            n += 1
    return n, finish


async def openai_stream(
    backend: Backend, request: BackendRequest, priority: int
) -> AsyncGenerator[StreamEvent]:
    """Stream ``request`` from ``backend``'s OpenAI-compatible API, chunks as they come.

    Yields one :class:`RawDelta` per network read and one :class:`StreamEnd` after the last
    chunk. Closing the generator early closes the HTTP stream (the backend aborts).

    Raises:
        BackendHttpError: the backend answered an HTTP error.
        BackendError: connection failure, a malformed or oversized event, an error event,
            or a stream that ended without a finish reason.

    """
    path, body = backend.openai_payload(request, priority)
    # Token ids fairq asked for itself (to continue a preempted request) are not relayed.
    strip_ids = bool(body.get("return_token_ids")) and not request.extra.get("return_token_ids")
    strip_timings = bool(body.get("timings_per_token")) and not request.extra.get(
        "timings_per_token"
    )
    rewrite = strip_ids or strip_timings or request.resume is not None
    finish = ""
    prompt_tokens = completion_tokens = 0
    url = backend.url(path)
    with stream_failures(backend.id, url):
        async with posted(
            backend.session(), url, backend.read_timeout,
            data=json_body(body), headers=STREAM_HEADERS,
        ) as resp:  # fmt: skip
            if resp.status != 200:
                raw, complete = await read_at_most(resp, backend.read_limits.error_bytes)
                if not complete:
                    resp.close()  # the rest is never read; the connection goes with it
                error = http_error(backend.id, resp.status, raw)
                raise BackendHttpError(error, resp.status, raw, resp.content_type)
            async for batch in sse_reads(resp.content, backend.loop_share, backend.read_timeout):
                data: list[str] = []
                objects: list[Mapping[str, Any]] = []
                tokens = 0
                done = False
                for payload in batch:
                    if payload == "[DONE]":
                        done = True
                        break
                    obj = backend.decode_event(payload)
                    try:
                        n, finished = _read_choices(obj)
                        tokens += n
                        finish = finished or finish
                        prompt_tokens, completion_tokens = usage_tokens(
                            obj, prompt_tokens, completion_tokens
                        )
                    except Exception as exc:  # any shape the code above did not foresee
                        raise backend.shape_error(obj) from exc
                    if not request.relay_usage and not obj.get("choices") and obj.get("usage"):
                        continue  # the usage fairq asked for, not the caller
                    if obj.get("model") != request.model and "model" in obj:
                        obj["model"] = request.model
                        payload = orjson.dumps(obj).decode()
                    if rewrite:
                        relayed = relay_payload(
                            obj, payload, request.resume, strip_ids, strip_timings
                        )
                        objects.append(obj)
                        if relayed is not None:
                            data.append(relayed)
                        continue
                    data.append(payload)
                    objects.append(obj)
                if data:
                    framed = "data: " + "\n\ndata: ".join(data) + "\n\n"
                    yield RawDelta(framed, tokens, objects=tuple(objects))
                if done:
                    break
    yield backend.stream_end(request, finish, prompt_tokens, completion_tokens)
