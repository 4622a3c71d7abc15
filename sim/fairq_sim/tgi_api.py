"""TGI-mode HTTP endpoints: ``/generate``, ``/generate_stream``, ``/``, info, health."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from fairq_sim.http_common import (
    DropConnection,
    EventStreamResponse,
    sse_data,
    until_disconnect,
)
from fairq_sim.runner import EngineClosedError
from fairq_sim.tgi_admission import (
    BodyRejected,
    Job,
    admit,
    count_failure,
    incomplete,
    read_body,
    state_of,
    stream_headers,
)
from fairq_sim.tgi_chat import chat_completions
from fairq_sim.tgi_protocol import TgiError, finish_reason, info

__all__ = ["tgi_routes"]


async def generate(request: Request) -> Response:
    """``POST /generate``."""
    return await _text_generation(request, stream=False, compat=False)


async def generate_stream(request: Request) -> Response:
    """``POST /generate_stream``."""
    return await _text_generation(request, stream=True, compat=False)


async def compat_generate(request: Request) -> Response:
    """``POST /``: streams if ``stream`` is true; otherwise a one-element list."""
    return await _text_generation(request, stream=None, compat=True)


async def _text_generation(request: Request, stream: bool | None, compat: bool) -> Response:
    state = state_of(request)
    assert state.tgi_metrics is not None
    try:
        body = await read_body(request, "inputs")
    except BodyRejected as exc:
        return PlainTextResponse(str(exc), status_code=exc.status)
    state.tgi_metrics.increment("tgi_request_count")
    if state.inject_error():
        return count_failure(state, incomplete()).response()
    streaming = bool(body.get("stream")) if stream is None else stream
    inputs = str(body.get("inputs") or "")
    try:
        job = admit(state, inputs, body.get("parameters"), compat)
    except TgiError as exc:
        error = count_failure(state, exc)
        if streaming:  # TGI validates inside the stream: HTTP 200, then an error event
            return EventStreamResponse(
                _single(error.event()), stream_headers(inputs), "text/event-stream"
            )
        return error.response()
    if streaming:
        return EventStreamResponse(
            _stream_events(job, inputs), stream_headers(inputs), "text/event-stream", job.close
        )
    result = await until_disconnect(request, _collect(job, inputs, compat))
    job.close()
    return result if result is not None else Response(status_code=499)


async def _single(event: bytes) -> AsyncIterator[bytes]:
    yield event


async def _stream_events(job: Job, inputs: str) -> AsyncIterator[bytes]:
    request = job.stream.request
    drop_after = job.state.config.drop_after_tokens
    try:
        async for index, token, finished in job.outputs():
            if index == 0:
                yield b":\n\n"
                continue
            event: dict[str, Any] = {"index": index, "token": token}
            event["generated_text"] = job.generated_text(inputs) if finished else None
            event["details"] = None
            if finished and job.params.details:
                event["details"] = {
                    "finish_reason": finish_reason(request),
                    "generated_tokens": request.num_output_tokens,
                    "seed": job.params.seed if job.params.do_sample else None,
                    "input_length": request.num_prompt_tokens,
                }
            yield sse_data(event)
            if drop_after is not None and index >= drop_after and not finished:
                raise DropConnection
    except EngineClosedError:
        yield count_failure(job.state, incomplete()).event()
    finally:
        job.close()


async def _collect(job: Job, inputs: str, compat: bool) -> Response:
    request = job.stream.request
    tokens: list[dict[str, Any]] = []
    try:
        async for index, token, _ in job.outputs():
            if index:
                tokens.append(token)
    except EngineClosedError:
        return count_failure(job.state, incomplete()).response()
    finally:
        job.close()
    body: dict[str, Any] = {"generated_text": job.generated_text(inputs)}
    if job.params.details:
        body["details"] = {
            "finish_reason": finish_reason(request),
            "generated_tokens": request.num_output_tokens,
            "seed": job.params.seed if job.params.do_sample else None,
            "prefill": [],
            "tokens": tokens,
        }
    assert request.finish_time is not None and request.scheduled_time is not None
    headers = stream_headers(inputs) | {
        "x-prompt-tokens": str(request.num_prompt_tokens),
        "x-generated-tokens": str(request.num_output_tokens),
        "x-queue-time": str(int((request.scheduled_time - request.arrival_time) * 1000)),
        "x-inference-time": str(int((request.finish_time - request.scheduled_time) * 1000)),
        "x-total-time": str(int((request.finish_time - request.arrival_time) * 1000)),
    }
    del headers["x-accel-buffering"], headers["cache-control"]
    return JSONResponse([body] if compat else body, headers=headers)


async def info_endpoint(request: Request) -> Response:
    """``GET /info``."""
    state = state_of(request)
    body = info(
        state.config.model,
        state.config.max_concurrent_requests,
        state.max_input_tokens,
        state.profile.max_model_len,
    )
    return JSONResponse(body)


async def health(request: Request) -> Response:
    """``GET /health``: 200 empty once ready, else 503 ``healthcheck``."""
    if state_of(request).ready():
        return Response(status_code=200)
    return JSONResponse({"error": "unhealthy", "error_type": "healthcheck"}, status_code=503)


async def models(request: Request) -> Response:
    """``GET /v1/models``: the one served model."""
    name = state_of(request).config.model
    card = {"id": name, "object": "model", "created": 0, "owned_by": name}
    return JSONResponse({"object": "list", "data": [card]})


def tgi_routes() -> list[Route]:
    """Return the TGI-mode routes (``/metrics`` is added by the app)."""
    return [
        Route("/generate", generate, methods=["POST"]),
        Route("/generate_stream", generate_stream, methods=["POST"]),
        Route("/", compat_generate, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/info", info_endpoint, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
