"""TGI mode: the Messages API (``/v1/chat/completions``) as TGI 3.3 renders it.

Every delta repeats ``role``, ``id`` is ``""``, ``model`` echoes the request, an EOS token
becomes ``finish_reason: "stop"`` with empty content, errors inside a stream are
``{"error": {"message", "http_status_code"}}``, and the stream ends with ``[DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

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
from fairq_sim.tgi_protocol import SYSTEM_FINGERPRINT, TgiError, chat_finish_reason
from fairq_sim.tokens import render_chat

__all__ = ["chat_completions"]


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions`` (Messages API)."""
    state = state_of(request)
    assert state.tgi_metrics is not None
    try:
        body = await read_body(request, "messages")
    except BodyRejected as exc:
        return PlainTextResponse(str(exc), status_code=exc.status)
    state.tgi_metrics.increment("tgi_request_count")
    if state.inject_error():
        return count_failure(state, incomplete()).response()
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
        job = admit(state, prompt, parameters, compat=False)
    except TgiError as exc:
        error = count_failure(state, exc)
        if streaming:
            events = _chat_error_events(error)
            return EventStreamResponse(events, stream_headers(prompt), "text/event-stream")
        return error.response()
    chat = _Chat(job, model_id, include_usage)
    if streaming:
        return EventStreamResponse(
            chat.events(), stream_headers(prompt), "text/event-stream", job.close
        )
    result = await until_disconnect(request, chat.collect())
    job.close()
    return result if result is not None else Response(status_code=499)


async def _chat_error_events(error: TgiError) -> AsyncIterator[bytes]:
    yield error.chat_event()
    yield b"data: [DONE]\n\n"


class _Chat:
    """Messages API rendering of one job."""

    def __init__(self, job: Job, model: str, include_usage: bool) -> None:
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
            yield count_failure(self.job.state, incomplete()).chat_event()
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
            return count_failure(self.job.state, incomplete()).response()
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
