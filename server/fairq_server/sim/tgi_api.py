"""TGI-mode HTTP endpoints: ``/generate``, ``/generate_stream``, ``/``, Messages API, info."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from fairq_server.sim.events import TokenOutput
from fairq_server.sim.http_common import (
    DropConnection,
    EventStreamResponse,
    sse_data,
    until_disconnect,
)
from fairq_server.sim.request import SimRequest
from fairq_server.sim.runner import EngineClosedError, RequestStream
from fairq_server.sim.state import SimState
from fairq_server.sim.tgi_protocol import (
    SYSTEM_FINGERPRINT,
    GenerateParams,
    TgiError,
    chat_finish_reason,
    finish_reason,
    info,
    overloaded,
    parse_parameters,
    token_json,
    validation_error,
)
from fairq_server.sim.tokens import EOS_TOKEN_ID, render_chat, token_logprob, token_text, tokenize

__all__ = ["tgi_routes"]

# axum's Sse::keep_alive default: a comment line every 15 s while no event is due.
KEEP_ALIVE_SECONDS = 15.0
_INCOMPLETE = TgiError(500, "incomplete_generation", "Incomplete generation", "incomplete")


class _BodyRejected(Exception):
    """axum's JSON extractor refused the body: plain-text 400 or 422."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _state(request: Request) -> SimState:
    state: SimState = request.app.state.sim
    return state


async def _body(request: Request, required: str) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BodyRejected(400, f"Failed to parse the request body as JSON: {exc}") from exc
    problem = None
    if not isinstance(body, dict):
        problem = "invalid type: expected a JSON object"
    elif required not in body:
        problem = f"missing field `{required}`"
    elif not isinstance(body.get("parameters", {}) or {}, dict):
        problem = "parameters: invalid type: expected struct GenerateParameters"
    else:
        params = body.get("parameters") or {}
        for key in ("max_new_tokens", "seed", "top_k", "temperature", "top_p"):
            value = params.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                problem = f"parameters.{key}: invalid type: {value!r}, expected a number"
    if problem is not None:
        raise _BodyRejected(
            422, f"Failed to deserialize the JSON body into the target type: {problem}"
        )
    return cast(dict[str, Any], body)


class _Job:
    """One admitted generation: its engine stream and the bookkeeping to undo."""

    def __init__(self, state: SimState, params: GenerateParams, stream: RequestStream) -> None:
        self.state = state
        self.params = params
        self.stream = stream
        self.closed = False

    def close(self) -> None:
        """Release the concurrency slot; abort the engine request if unfinished."""
        if self.closed:
            return
        self.closed = True
        self.state.in_flight -= 1
        if not self.stream.done:
            self.state.runner.abort(self.stream.request.request_id)

    async def outputs(self) -> AsyncIterator[tuple[int, dict[str, Any], bool]]:
        """Yield ``(index, token, finished)``; ``index`` 0 means a keep-alive tick."""
        request = self.stream.request
        index = 0
        while not self.stream.done:
            try:
                output = await _wait(self.stream, KEEP_ALIVE_SECONDS)
            except TimeoutError:
                yield 0, {}, False
                continue
            index += 1
            special = output.token_id == EOS_TOKEN_ID
            text = token_text(output.token_id, skip_special=False)
            logprob = token_logprob(request.seed, index - 1)
            yield index, token_json(output.token_id, text, logprob, special), output.finished

    def generated_text(self, prompt: str) -> str:
        """Return the output text (special tokens skipped), with the prompt if asked."""
        text = self.stream.request.output_text
        return prompt + text if self.params.return_full_text else text


async def _wait(stream: RequestStream, timeout: float) -> TokenOutput:
    async with asyncio.timeout(timeout):
        return await stream.get()


def _admit(state: SimState, inputs: str, parameters: dict[str, Any] | None, compat: bool) -> _Job:
    """Validate and queue a request as TGI's ``Infer`` does; raises :class:`TgiError`."""
    metrics = state.tgi_metrics
    assert metrics is not None
    if state.in_flight >= state.config.max_concurrent_requests:
        raise overloaded()
    if not inputs:
        raise validation_error("`inputs` cannot be empty")
    input_ids = tokenize(inputs)
    params = parse_parameters(
        parameters,
        len(input_ids),
        state.max_input_tokens,
        state.profile.max_model_len,
        default_full_text=compat,
    )
    metrics.observe("tgi_request_input_length", float(params.input_length))
    metrics.observe("tgi_request_max_new_tokens", float(params.max_new_tokens))
    number = state.next_number()
    sim_request = SimRequest(
        request_id=f"tgi-{number}",
        prompt_token_ids=input_ids,
        max_tokens=params.max_new_tokens,
        stop=params.stop,
        seed=params.seed if params.seed is not None else state.default_seed(number),
    )
    try:
        stream = state.runner.submit(sim_request)
    except EngineClosedError as exc:
        raise _INCOMPLETE from exc
    state.in_flight += 1
    return _Job(state, params, stream)


def _fail(state: SimState, error: TgiError) -> TgiError:
    if error.failure is not None and state.tgi_metrics is not None:
        state.tgi_metrics.increment("tgi_request_failure", (("err", error.failure),))
    return error


def _headers(inputs: str) -> dict[str, str]:
    return {
        "x-compute-type": "sim",
        "x-compute-characters": str(len(inputs)),
        "x-accel-buffering": "no",
        "cache-control": "no-cache",
    }


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
    state = _state(request)
    assert state.tgi_metrics is not None
    try:
        body = await _body(request, "inputs")
    except _BodyRejected as exc:
        return PlainTextResponse(str(exc), status_code=exc.status)
    state.tgi_metrics.increment("tgi_request_count")
    if state.inject_error():
        return _fail(state, _INCOMPLETE).response()
    streaming = bool(body.get("stream")) if stream is None else stream
    inputs = str(body.get("inputs") or "")
    try:
        job = _admit(state, inputs, body.get("parameters"), compat)
    except TgiError as exc:
        error = _fail(state, exc)
        if streaming:  # TGI validates inside the stream: HTTP 200, then an error event
            return EventStreamResponse(
                _single(error.event()), _headers(inputs), "text/event-stream"
            )
        return error.response()
    if streaming:
        return EventStreamResponse(
            _stream_events(job, inputs), _headers(inputs), "text/event-stream", job.close
        )
    result = await until_disconnect(request, _collect(job, inputs, compat))
    job.close()
    return result if result is not None else Response(status_code=499)


async def _single(event: bytes) -> AsyncIterator[bytes]:
    yield event


async def _stream_events(job: _Job, inputs: str) -> AsyncIterator[bytes]:
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
        yield _fail(job.state, _INCOMPLETE).event()
    finally:
        job.close()


async def _collect(job: _Job, inputs: str, compat: bool) -> Response:
    request = job.stream.request
    tokens: list[dict[str, Any]] = []
    try:
        async for index, token, _ in job.outputs():
            if index:
                tokens.append(token)
    except EngineClosedError:
        return _fail(job.state, _INCOMPLETE).response()
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
    headers = _headers(inputs) | {
        "x-prompt-tokens": str(request.num_prompt_tokens),
        "x-generated-tokens": str(request.num_output_tokens),
        "x-queue-time": str(int((request.scheduled_time - request.arrival_time) * 1000)),
        "x-inference-time": str(int((request.finish_time - request.scheduled_time) * 1000)),
        "x-total-time": str(int((request.finish_time - request.arrival_time) * 1000)),
    }
    del headers["x-accel-buffering"], headers["cache-control"]
    return JSONResponse([body] if compat else body, headers=headers)


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions`` (Messages API)."""
    state = _state(request)
    assert state.tgi_metrics is not None
    try:
        body = await _body(request, "messages")
    except _BodyRejected as exc:
        return PlainTextResponse(str(exc), status_code=exc.status)
    state.tgi_metrics.increment("tgi_request_count")
    if state.inject_error():
        return _fail(state, _INCOMPLETE).response()
    messages = body.get("messages")
    prompt = (
        render_chat(m for m in messages if isinstance(m, dict))
        if isinstance(messages, list)
        else ""
    )
    model = body.get("model")
    model_id = state.config.model if model in (None, "tgi") else str(model)
    stop = body.get("stop")
    parameters = {
        "max_new_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
        "stop": [stop] if isinstance(stop, str) else stop,
        "seed": body.get("seed"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "details": True,
        "do_sample": body.get("temperature") not in (None, 0),
    }
    parameters = {k: v for k, v in parameters.items() if v is not None}
    streaming = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    try:
        job = _admit(state, prompt, parameters, compat=False)
    except TgiError as exc:
        error = _fail(state, exc)
        if streaming:
            events = _chat_error_events(error)
            return EventStreamResponse(events, _headers(prompt), "text/event-stream")
        return error.response()
    chat = _Chat(job, model_id, include_usage)
    if streaming:
        return EventStreamResponse(chat.events(), _headers(prompt), "text/event-stream", job.close)
    result = await until_disconnect(request, chat.collect())
    job.close()
    return result if result is not None else Response(status_code=499)


async def _chat_error_events(error: TgiError) -> AsyncIterator[bytes]:
    yield error.chat_event()
    yield b"data: [DONE]\n\n"


class _Chat:
    """Messages API rendering of one job."""

    def __init__(self, job: _Job, model: str, include_usage: bool) -> None:
        self.job = job
        self.model = model
        self.include_usage = include_usage

    def _envelope(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "object": kind,
            "id": "",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            **fields,
        }

    def _usage(self) -> dict[str, int]:
        request = self.job.stream.request
        prompt, completion = request.num_prompt_tokens, request.num_output_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    async def events(self) -> AsyncIterator[bytes]:
        """Yield chunks, the usage chunk if asked for, then ``[DONE]``."""
        request = self.job.stream.request
        drop_after = self.job.state.config.drop_after_tokens
        try:
            async for index, token, finished in self.job.outputs():
                if index == 0:
                    yield b":\n\n"
                    continue
                content = "" if token["special"] else token["text"]
                choice = {
                    "index": 0,
                    "delta": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": chat_finish_reason(request) if finished else None,
                }
                chunk = self._envelope("chat.completion.chunk", choices=[choice], usage=None)
                yield sse_data(chunk)
                if finished and self.include_usage:
                    usage_chunk = self._envelope("chat.completion.chunk", choices=[])
                    yield sse_data(usage_chunk | {"usage": self._usage()})
                if drop_after is not None and index >= drop_after and not finished:
                    raise DropConnection
        except EngineClosedError:
            yield _fail(self.job.state, _INCOMPLETE).chat_event()
        finally:
            self.job.close()
        yield b"data: [DONE]\n\n"

    async def collect(self) -> Response:
        """Return the whole ``chat.completion``."""
        request = self.job.stream.request
        try:
            async for _ in self.job.outputs():
                pass
        except EngineClosedError:
            return _fail(self.job.state, _INCOMPLETE).response()
        finally:
            self.job.close()
        message = {"role": "assistant", "content": request.output_text}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": chat_finish_reason(request),
        }
        return JSONResponse(
            self._envelope("chat.completion", choices=[choice], usage=self._usage())
        )


async def info_endpoint(request: Request) -> Response:
    """``GET /info``."""
    state = _state(request)
    body = info(
        state.config.model,
        state.config.max_concurrent_requests,
        state.max_input_tokens,
        state.profile.max_model_len,
    )
    return JSONResponse(body)


async def health(request: Request) -> Response:
    """``GET /health``: 200 empty once ready, else 503 ``healthcheck``."""
    if _state(request).ready():
        return Response(status_code=200)
    return JSONResponse({"error": "unhealthy", "error_type": "healthcheck"}, status_code=503)


async def models(request: Request) -> Response:
    """``GET /v1/models``: the one served model."""
    name = _state(request).config.model
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
