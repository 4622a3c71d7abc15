"""vLLM-mode HTTP endpoints: completions, chat completions, models, health, version."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fairq_sim.http_common import (
    BodyError,
    DropConnection,
    EventStreamResponse,
    read_json_object,
    sse_data,
    until_disconnect,
)
from fairq_sim.request import SimRequest
from fairq_sim.runner import EngineClosedError, RequestStream
from fairq_sim.state import SimState
from fairq_sim.vllm_batch import collect_batch, stream_batch
from fairq_sim.vllm_protocol import (
    VERSION,
    CompletionParams,
    Kind,
    TextAccumulator,
    VllmError,
    chat_chunk,
    completion_chunk,
    parse_params,
    usage,
)

__all__ = ["vllm_routes"]


def _state(request: Request) -> SimState:
    state: SimState = request.app.state.sim
    return state


def _fingerprint(model: str) -> str:
    return f"vllm-{VERSION}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await _generate(request, "completion")


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await _generate(request, "chat")


def _unauthorized(request: Request) -> Response | None:
    """Return vLLM's 401 unless the request carries the configured API key."""
    key = _state(request).config.api_key
    if key is None or request.headers.get("authorization") == f"Bearer {key}":
        return None
    return JSONResponse({"error": "Unauthorized"}, status_code=401)


async def _generate(request: Request, kind: Kind) -> Response:
    state = _state(request)
    if (refused := _unauthorized(request)) is not None:
        return refused
    try:
        body = await read_json_object(request)
        prompts = _batch(body, kind)
        bodies = [{**body, "prompt": p} for p in prompts] if prompts else [body]
        max_len = state.profile.max_model_len
        all_params = [parse_params(b, kind, state.config.model, max_len) for b in bodies]
    except BodyError as exc:
        return VllmError(400, "Bad Request", str(exc)).response()
    except VllmError as exc:
        return exc.response()
    if state.inject_error():
        return VllmError(500, "InternalServerError", "Simulated engine failure.").response()
    params = all_params[0]
    external_id = request.headers.get("x-request-id") or params.request_id or uuid.uuid4().hex[:16]
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    replies: list[_Reply] = []
    for i, each in enumerate(all_params):
        number = state.next_number()
        engine_id = f"{external_id}-{i}" if prompts else external_id
        sim_request = SimRequest(
            request_id=f"{engine_id}#{number}",  # client ids may repeat; engine ids may not
            prompt_token_ids=each.prompt_ids,
            max_tokens=each.max_tokens,
            # vLLM 0.32 running fcfs accepts the field and ignores it.
            priority=_engine_priority(state, each.priority),
            ignore_eos=each.ignore_eos,
            stop=each.stop,
            seed=each.seed if each.seed is not None else state.default_seed(number),
        )
        try:
            stream = state.runner.submit(sim_request)
        except EngineClosedError as exc:
            for reply in replies:
                reply.close()
            return VllmError(500, "InternalServerError", str(exc)).response()
        replies.append(_Reply(state, each, stream, prefix + engine_id))
    if prompts:
        return await _answer_batch(request, replies, prefix + external_id, params)
    reply = replies[0]
    if params.stream:
        return EventStreamResponse(reply.events(), on_close=reply.close)
    result = await until_disconnect(request, reply.collect())
    reply.close()
    if result is None:
        return Response(status_code=499)  # nobody is listening any more
    return result


def _batch(body: dict[str, Any], kind: Kind) -> list[object]:
    """Return the prompts of a completions request's list of several, else ``[]``."""
    prompt = body.get("prompt")
    if kind != "completion" or not isinstance(prompt, list) or len(prompt) < 2:
        return []
    if all(isinstance(p, str | list) for p in prompt):
        return list(prompt)
    return []  # token ids, or something parse_params refuses


async def _answer_batch(
    request: Request, replies: list[_Reply], response_id: str, params: CompletionParams
) -> Response:
    def close() -> None:
        for reply in replies:
            reply.close()

    if params.stream:
        events = stream_batch(replies, response_id, params.include_usage)
        return EventStreamResponse(events, on_close=close)
    result = await until_disconnect(request, collect_batch(replies, response_id))
    close()
    return Response(status_code=499) if result is None else result


def _engine_priority(state: SimState, priority: int) -> int:
    """Return the engine priority (lower first); SGLang by default serves higher first."""
    if not state.config.priority_mode:
        return 0
    if state.config.mode == "sglang" and not state.config.low_priority_first:
        return -priority
    return priority


def _escaped(text: str) -> str:
    """Return ``text`` as it appears inside a JSON string."""
    return json.dumps(text)[1:-1]


class _Reply:
    """Builds the response of one request from its token stream."""

    def __init__(
        self, state: SimState, params: CompletionParams, stream: RequestStream, response_id: str
    ) -> None:
        self.state = state
        self.params = params
        self.stream = stream
        self.id = response_id
        self.model = state.config.model
        self.created = int(time.time())
        self.fingerprint = _fingerprint(self.model)
        self.drop_after = state.config.drop_after_tokens

    def close(self) -> None:
        """Abort the engine request unless it finished (idempotent)."""
        if not self.stream.done:
            self.state.runner.abort(self.stream.request.request_id)

    async def events(self) -> AsyncIterator[bytes]:
        """Yield the SSE body; abort the engine request if the client goes away."""
        request = self.stream.request
        chat = self.params.kind == "chat"
        text = TextAccumulator(request.stop)
        count = 0
        try:
            async for output in self.stream:
                count += 1
                if chat and count == 1:
                    first = {"role": "assistant", "content": ""}
                    opening = chat_chunk(self.id, self.created, self.model, first, first=True)
                    if self.params.return_token_ids:
                        opening["prompt_token_ids"] = list(request.prompt_token_ids)
                    yield sse_data(opening)
                delta = text.push(output)
                finish = request.finish_reason if output.finished else None
                reason = finish.value if finish is not None else None
                stop_reason = request.stop_reason if output.finished else None
                if chat:
                    content = self._tool_delta(delta, count, output.finished)
                    chunk = chat_chunk(
                        self.id, self.created, self.model, content, reason, stop_reason
                    )
                else:
                    chunk = completion_chunk(
                        self.id, self.created, self.model, delta, reason, stop_reason
                    )
                if self.params.return_token_ids:
                    # As vLLM 0.32 streams them (tests/fixtures/*-token-ids.sse): each chunk's
                    # ids, and the prompt's in the first completion chunk.
                    choice = chunk["choices"][0]
                    choice["token_ids"] = [output.token_id]
                    if not chat and count == 1:
                        choice["prompt_token_ids"] = list(request.prompt_token_ids)
                if self.params.continuous_usage:
                    chunk["usage"] = usage(request.num_prompt_tokens, count)
                yield sse_data(chunk)
                if self.drop_after is not None and count >= self.drop_after and not output.finished:
                    raise DropConnection
            if self.params.include_usage:
                yield sse_data(self._usage_chunk())
        except EngineClosedError as exc:
            error = VllmError(500, "InternalServerError", str(exc))
            yield sse_data(error.body())
        finally:
            self.close()
        yield b"data: [DONE]\n\n"

    def _tool_delta(self, delta: str, count: int, finished: bool) -> dict[str, Any]:
        """Return the chunk's delta: text, or a piece of the forced tool call's arguments."""
        if self.params.tool is None:
            return {"content": delta}
        arguments = _escaped(delta) + ('"}' if finished else "")
        if count > 1:
            return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
        call = {
            "id": f"chatcmpl-tool-{self.id[-16:]}",
            "type": "function",
            "index": 0,
            "function": {"name": self.params.tool, "arguments": '{"text": "' + arguments},
        }
        return {"tool_calls": [call]}

    def _usage_chunk(self) -> dict[str, Any]:
        request = self.stream.request
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.params.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(request.num_prompt_tokens, request.num_output_tokens),
            "system_fingerprint": self.fingerprint,
        }

    async def collect(self) -> Response:
        """Wait for the whole output and return the non-streaming response."""
        request = self.stream.request
        text = TextAccumulator(request.stop)
        try:
            async for output in self.stream:
                text.push(output)
        except EngineClosedError as exc:
            return VllmError(500, "InternalServerError", str(exc)).response()
        finally:
            self.close()
        assert request.finish_reason is not None
        total = usage(request.num_prompt_tokens, request.num_output_tokens)
        total_usage = {**total, "prompt_tokens_details": None, "completion_tokens_details": None}
        choice: dict[str, Any]
        if self.params.kind == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text.text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning": None,
            }
            if self.params.tool is not None:
                message["content"] = None
                message["tool_calls"] = [
                    {
                        "id": f"chatcmpl-tool-{self.id[-16:]}",
                        "type": "function",
                        "function": {
                            "name": self.params.tool,
                            "arguments": json.dumps({"text": text.text}),
                        },
                    }
                ]
            choice = {"index": 0, "message": message, "logprobs": None}
        else:
            choice = {"index": 0, "text": text.text, "logprobs": None}
        choice["finish_reason"] = request.finish_reason.value
        choice["stop_reason"] = request.stop_reason
        choice["token_ids"] = None
        if self.params.kind == "completion":
            choice.update(prompt_logprobs=None, prompt_token_ids=None, routed_experts=None)
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.params.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": self.fingerprint,
            "usage": total_usage,
        }
        if self.params.kind == "chat":
            body.update(prompt_logprobs=None, prompt_token_ids=None)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return JSONResponse(body)


async def models(request: Request) -> Response:
    """``GET /v1/models``: one model, shaped like the recorded ``models.json``."""
    state = _state(request)
    if (refused := _unauthorized(request)) is not None:
        return refused
    name = state.config.model
    permission = {
        "id": f"modelperm-{hashlib.sha256(name.encode()).hexdigest()[:16]}",
        "object": "model_permission",
        "created": state.created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": state.config.mode,
        "root": name,
        "parent": None,
        "max_model_len": state.profile.max_model_len,
        "permission": [permission],
    }
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request) -> Response:
    """``GET /health``: 200 with an empty body once ready, else 503."""
    return Response(status_code=200 if _state(request).ready() else 503)


async def version(request: Request) -> Response:
    """``GET /version``."""
    return JSONResponse({"version": VERSION})


def vllm_routes() -> list[Route]:
    """Return the vLLM-mode routes (``/metrics`` is added by the app)."""
    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
    ]
