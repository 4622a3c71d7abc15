"""HuggingFace TGI: ``/generate_stream`` for prompts, the Messages API for chat."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

import aiohttp

from fairq_server.backends.base import Backend
from fairq_server.backends.continuation import continue_openai, continue_tgi
from fairq_server.backends.http_reading import describe_failure, read_at_most, token_count
from fairq_server.backends.metrics import sample_sums
from fairq_server.backends.openai_wire import openai_body
from fairq_server.backends.passthrough import openai_stream
from fairq_server.backends.request import (
    BackendRequest,
    MetricsSample,
    StreamEvent,
    TextDelta,
)
from fairq_server.errors import BackendError, BackendFailure
from fairq_server.names import escape

__all__ = ["TgiBackend"]

log = logging.getLogger(__name__)
_MAX_INFO_BYTES = 65_536

_QUEUE = "tgi_queue_size"
_BATCH = "tgi_batch_current_size"
_TPOT = "tgi_request_mean_time_per_token_duration"
_WANTED = (_QUEUE, _BATCH, f"{_TPOT}_sum", f"{_TPOT}_count")
_FINISH = {"eos_token": "stop", "stop_sequence": "stop"}

# TGI's error_type values (router/src/infer/mod.rs, server.rs): kind, and whether another
# backend may succeed.
_ERROR_TYPES: dict[str, tuple[BackendFailure, bool]] = {
    "validation": (BackendFailure.INVALID_REQUEST, False),
    "template_error": (BackendFailure.INVALID_REQUEST, False),
    "tool_error": (BackendFailure.INVALID_REQUEST, False),
    "overloaded": (BackendFailure.OVERLOADED, True),
    "missing_template_variable": (BackendFailure.INVALID_REQUEST, False),
    "generation": (BackendFailure.FAILED, False),
    "incomplete_generation": (BackendFailure.UNAVAILABLE, True),
    "incomplete_generation_stream": (BackendFailure.UNAVAILABLE, True),
    "stream_serialization_error": (BackendFailure.FAILED, False),
}
# TGI's Messages API puts every stream error under http_status_code 422 without a type, so
# the kind is read from the message prefix TGI uses (router/src/infer/mod.rs).
_MESSAGE_KINDS = (
    ("Model is overloaded", "overloaded"),
    ("Input validation error", "validation"),
    ("Template error", "template_error"),
    ("Tool error", "tool_error"),
    ("Incomplete generation", "incomplete_generation"),
)


class TgiBackend(Backend):
    """Adapter for TGI. TGI has no priorities: fairq's queue and gate are the only protection."""

    kind = "tgi"
    # The Messages API has no way to continue a final assistant message.
    continues_chat = False

    def parse_metrics(self, text: str) -> MetricsSample:
        """Read queue size, batch size and mean time per token from TGI's metrics.

        TGI exports a series only after its first use, so an idle server may lack all of
        them; that is an empty queue, not a broken endpoint.
        """
        sums = sample_sums(text, _WANTED)
        return MetricsSample(
            waiting=sums.get(_QUEUE, 0.0),
            running=sums.get(_BATCH, 0.0),
            tpot_sum=sums.get(f"{_TPOT}_sum", 0.0),
            tpot_count=sums.get(f"{_TPOT}_count", 0.0),
            missing=(("kv_usage", ""),),  # TGI exports no KV-cache usage
        )

    async def verify_models(self, timeout: float = 5.0) -> None:
        """Check ``/v1/models`` as for any backend, then read the context from ``/info``.

        TGI's ``max_total_tokens`` (prompt plus output) is every model's context; an
        ``/info`` that does not say it leaves the context unknown.
        """
        await super().verify_models(timeout)
        try:
            async with self.session().get(
                f"{self.base_url}/info", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                body, complete = await read_at_most(resp, _MAX_INFO_BYTES)
                if not complete:
                    resp.close()
                doc = json.loads(body) if resp.status == 200 and complete else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info(
                "backend %s: /info gave no context length: %s",
                self.id,
                escape(str(exc), 300) if isinstance(exc, ValueError) else describe_failure(exc),
            )
            return
        total = doc.get("max_total_tokens") if isinstance(doc, dict) else None
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            self.context_lengths = dict.fromkeys(self.models, total)

    def _within_context(self, request: BackendRequest) -> BackendRequest:
        """Leave out a bound fairq chose that is at least the model's context.

        TGI refuses a prompt plus ``max_new_tokens`` over ``max_total_tokens`` instead of
        capping it (every caller that gave no bound got a 422 when ``limits.max_tokens`` was
        larger); left out, TGI generates the rest of the context, less than the bound.
        """
        s = request.sampling
        context = self.context_lengths.get(request.model)
        if (
            s.max_tokens_defaulted
            and context is not None
            and s.max_tokens is not None
            and s.max_tokens >= context
        ):
            return replace(request, sampling=replace(s, max_tokens=None))
        return request

    def payload(self, request: BackendRequest) -> tuple[str, dict[str, Any]]:
        """Return the path and JSON body for ``request``.

        Chat goes to the OpenAI-compatible Messages API, pass-through fields merged as for
        any OpenAI server. A prompt goes to ``/generate_stream``; its pass-through fields
        are TGI's own ``parameters`` (``top_k``, ``repetition_penalty``, ``grammar``, ...).
        """
        request = self._within_context(request)
        s = request.sampling
        if request.messages is not None:
            return openai_body(request)
        params = {
            "max_new_tokens": s.max_tokens,
            "temperature": s.temperature or None,  # TGI requires temperature > 0
            "do_sample": True if s.temperature else None,  # TGI decodes greedily at exactly 1.0
            "top_p": s.top_p if s.top_p is not None and s.top_p < 1.0 else None,
            "seed": s.seed,
            "stop": list(s.stop) or None,
            "details": True,
        }
        merged = dict(request.extra)
        merged.update({k: v for k, v in params.items() if v is not None})
        body = {"inputs": request.prompt, "parameters": merged}
        if request.resume is not None:
            continue_tgi(body, request.resume)
        return "/generate_stream", body

    def openai_payload(self, request: BackendRequest, priority: int) -> tuple[str, dict[str, Any]]:
        """Return the OpenAI-shaped request (TGI serves ``/v1/completions`` too)."""
        path, body = openai_body(self._within_context(request))
        if request.resume is not None:  # completions only: chat is never preempted on TGI
            continue_openai(body, request.resume, token_ids=False)
        return path, body

    def stream(self, request: BackendRequest, priority: int) -> AsyncGenerator[StreamEvent]:
        """Stream text deltas, then one :class:`StreamEnd`; ``priority`` is not used.

        The HTTP door gets the backend's own chunks (:func:`openai_stream`) directly.
        """
        if request.relay_chunks:
            return openai_stream(self, request, priority)
        return self._text_stream(request)

    async def _text_stream(self, request: BackendRequest) -> AsyncGenerator[StreamEvent]:
        path, body = self.payload(request)
        finish = ""
        prompt_tokens = completion_tokens = 0
        async for batch in self._sse(path, body):
            texts: list[str] = []
            for obj in batch:
                try:
                    reason, usage = self._read_event(obj, texts)
                except Exception as exc:  # any shape _read_event did not foresee
                    raise self.shape_error(obj) from exc
                if reason:
                    finish = _FINISH.get(reason, reason)
                if usage is not None:
                    prompt_tokens, completion_tokens = usage
                elif "token" in obj:
                    completion_tokens += 1
            if texts:
                yield TextDelta("".join(texts), len(texts))
        yield self.stream_end(request, finish, prompt_tokens, completion_tokens)

    def _error_event(self, err: object, error_type: object) -> BackendError:
        """Translate a TGI error event: TGI names the kind in ``error_type``, or its message.

        Errors of no kind TGI names fall back to the HTTP status nested in the event.
        """
        message = str(err.get("message", err)) if isinstance(err, dict) else str(err)
        if error_type is None:
            error_type = next((t for p, t in _MESSAGE_KINDS if message.startswith(p)), None)
        known = _ERROR_TYPES.get(str(error_type)) if error_type is not None else None
        if known is None:
            return super()._error_event(err, error_type)
        kind, retryable = known
        return BackendError(
            f"backend {self.id} failed: {escape(message, 1000)}", kind, retryable=retryable
        )

    @staticmethod
    def _read_event(obj: dict[str, Any], texts: list[str]) -> tuple[str, tuple[int, int] | None]:
        """Append the event's text to ``texts``; return its finish reason and final usage.

        Handles both ``/generate_stream`` token events and Messages API chunks.
        """
        token = obj.get("token")
        if token is not None:
            text = token["text"]
            if not isinstance(text, str):
                raise TypeError("token text is not a string")
            if text and not token.get("special"):
                texts.append(text)
            details = obj.get("details")
            if isinstance(details, dict):
                counts = (
                    token_count(details.get("input_length")),
                    token_count(details["generated_tokens"]),
                )
                return str(details.get("finish_reason") or ""), counts
            return "", None
        reason = ""
        for choice in obj.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content is not None and not isinstance(content, str):
                raise TypeError("content is not a string")
            if content:
                texts.append(content)
            if choice.get("finish_reason"):
                reason = str(choice["finish_reason"])
        usage = obj.get("usage")
        if usage:
            return reason, (
                token_count(usage.get("prompt_tokens")),
                token_count(usage.get("completion_tokens")),
            )
        return reason, None
