"""Answers both the single and the fanned-out completions paths write: errors, SSE starts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from fairq_server.backends.passthrough import BackendHttpError
from fairq_server.doors.http.errors import HttpError, error_body, error_for, error_response
from fairq_server.doors.http.sse import SSE_HEADERS
from fairq_server.errors import BackendFailedError, ModelNotFoundError, SchedulerError

__all__ = [
    "answer_too_large",
    "backend_http_error",
    "error_answer",
    "error_json",
    "is_json",
    "parse_frames",
    "prepare",
]


def parse_frames(text: str) -> list[dict[str, Any]]:
    """Parse relayed ``data:`` frames back into chunks (for a merged answer)."""
    chunks = []
    for frame in text.split("\n\n"):
        if frame.startswith("data: "):
            chunks.append(json.loads(frame[6:]))
    return chunks


def answer_too_large(limit: int) -> HttpError:
    """Return the 400 for a non-streamed answer above ``http.max_answer_chars``."""
    return HttpError(
        400,
        f"the answer is larger than {limit} characters (http.max_answer_chars); ask for it "
        'streamed ("stream": true), or for fewer tokens or logprobs',
        code="answer_too_large",
    )


def backend_http_error(exc: SchedulerError) -> BackendHttpError | None:
    """Return the backend's own HTTP refusal behind ``exc``, if that is what it is."""
    cause = exc.cause if isinstance(exc, BackendFailedError) else None
    return cause if isinstance(cause, BackendHttpError) else None


def error_json(exc: SchedulerError) -> bytes:
    """Return the OpenAI error object for ``exc``: the backend's own if it sent one."""
    backend = backend_http_error(exc)
    if backend is not None and is_json(backend):
        return backend.body
    error = error_for(exc)
    return error_body(error.message, error.type, code=error.code)


def error_answer(
    exc: SchedulerError, retry_after: int, not_found: Callable[[], HttpError]
) -> web.Response:
    """Return the answer to a request that failed before its response began.

    An unknown model's answer names the models served (those ``GET /v1/models`` lists to the
    same caller).
    """
    if isinstance(exc, ModelNotFoundError):
        return error_response(not_found())
    backend = backend_http_error(exc)
    if backend is not None:
        # The backend refused the request itself: its status and body, unchanged.
        return web.Response(
            status=backend.status, body=error_json(exc), content_type="application/json"
        )
    return error_response(error_for(exc), retry_after)


async def prepare(request: web.Request, request_id: str) -> web.StreamResponse:
    """Start a streamed (server-sent events) answer."""
    resp = web.StreamResponse(status=200, headers={**SSE_HEADERS, "x-request-id": request_id})
    await resp.prepare(request)
    return resp


def is_json(exc: BackendHttpError) -> bool:
    """Tell whether the backend's refusal body is a JSON object."""
    return exc.content_type == "application/json" and exc.body.lstrip().startswith(b"{")
