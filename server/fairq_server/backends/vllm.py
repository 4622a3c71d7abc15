"""vLLM's OpenAI-compatible server: ``/v1/completions`` and ``/v1/chat/completions``."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from fairq_server.backends.base import Backend
from fairq_server.backends.continuation import continue_openai, predicted_tokens
from fairq_server.backends.http_reading import usage_tokens
from fairq_server.backends.metrics import sample_sums
from fairq_server.backends.openai_wire import openai_body
from fairq_server.backends.passthrough import openai_stream
from fairq_server.backends.request import (
    BackendRequest,
    MetricsSample,
    StreamEvent,
    TextDelta,
)

__all__ = ["TPOT_HISTOGRAMS", "VllmBackend"]

# Per-request time per output token (0.11+), else inter-token latency (0.10.2+), else the
# histogram older releases exported; the first one present is used.
TPOT_HISTOGRAMS = (
    "vllm:request_time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
)
_WAITING = "vllm:num_requests_waiting"
_RUNNING = "vllm:num_requests_running"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_WANTED = (
    _WAITING,
    _RUNNING,
    *_KV,
    *(f"{h}_{s}" for h in TPOT_HISTOGRAMS for s in ("sum", "count")),
)


class VllmBackend(Backend):
    """Adapter for vLLM; passes the tier as ``priority`` when the backend schedules by it."""

    kind = "vllm"
    continues_by_ids = True
    # vLLM's completions API (and the OpenAI API it follows) takes ``prompt`` as token ids.
    token_prompts = True
    # vLLM's exposition is ~50 kB, rendered on the engine's own core: 6-19 ms per scrape in
    # full, ~1 ms for these (docs/design/scraping.md).
    metrics_filter = _WANTED

    def parse_metrics(self, text: str) -> MetricsSample:
        """Read waiting/running, KV usage and the TPOT histogram from vLLM's metrics."""
        sums = sample_sums(text, _WANTED)
        if _WAITING not in sums or _RUNNING not in sums:
            raise ValueError(f"no {_WAITING} / {_RUNNING} in the metrics")
        kv = next((sums[k] for k in _KV if k in sums), None)
        missing = [] if kv is not None else [("kv_usage", _KV[0])]
        tpot_sum = tpot_count = 0.0
        for hist in TPOT_HISTOGRAMS:
            if f"{hist}_count" in sums:
                tpot_sum, tpot_count = sums[f"{hist}_sum"], sums[f"{hist}_count"]
                break
        else:
            missing.append(("tpot", f"{TPOT_HISTOGRAMS[0]}_count"))
        return MetricsSample(
            sums[_WAITING], sums[_RUNNING], kv, tpot_sum, tpot_count, missing=tuple(missing)
        )

    def payload(self, request: BackendRequest, priority: int) -> tuple[str, dict[str, Any]]:
        """Return the path and JSON body for ``request`` (pass-through fields included)."""
        path, body = openai_body(request, self.context_lengths.get(request.model))
        if request.request_id:
            body["request_id"] = request.request_id
        if self.preempt:
            # Token ids make a continuation after a preemption token-exact (completions) and
            # count its output exactly (vLLM merges the deltas of a stream read late).
            body["return_token_ids"] = True
        if request.resume is not None:
            continue_openai(body, request.resume, token_ids=self.continues_by_ids)
            if request.request_id:  # the aborted attempt's id may still be in use
                body["request_id"] = f"{request.request_id}-{request.resume.tokens}"
        if self.priority_scheduling:
            # vLLM running `fcfs` silently ignores the field, so send it only where it counts.
            body["priority"] = priority
        return path, body

    def openai_payload(self, request: BackendRequest, priority: int) -> tuple[str, dict[str, Any]]:
        """Return :meth:`payload`: vLLM's API is the OpenAI one."""
        return self.payload(request, priority)

    def stream(self, request: BackendRequest, priority: int) -> AsyncGenerator[StreamEvent]:
        """Stream text deltas (one per network read), then one :class:`StreamEnd` with usage.

        What a choice carries beside text (tool calls, logprobs, reasoning) travels in the
        delta's ``extra``, one object per choice event. The HTTP door gets the backend's own
        chunks (:func:`openai_stream`) with no generator of this method's in between: each
        layer costs every network read a resumption (docs/design/hot-path.md).
        """
        if request.relay_chunks:
            return openai_stream(self, request, priority)
        return self._text_stream(request, priority)

    async def _text_stream(
        self, request: BackendRequest, priority: int
    ) -> AsyncGenerator[StreamEvent]:
        path, body = self.payload(request, priority)
        finish = ""
        prompt_tokens = completion_tokens = 0
        prompt_ids: tuple[int, ...] | None = None
        counted = 0  # the attempt's tokens by the engine's own count, as of the last delta
        async with self._sse_reads(path, body) as reads:
            async for raw in reads:
                batch, done = self.decode_batch(raw)
                texts: list[str] = []
                extras: list[dict[str, Any]] = []
                ids: list[int] | None = [] if body.get("return_token_ids") else None
                # Ids of the batch's last chunks that brought no text: vLLM holds back the bytes
                # of an incomplete character. They go in a delta of their own, so a continuation
                # can end its prompt where the text sent so far ends.
                held: list[int] = []
                predicted: int | None = None
                for obj in batch:
                    predicted = predicted_tokens(obj) if "timings" in obj else predicted
                    try:
                        for choice in obj.get("choices") or ():
                            delta = choice.get("delta")
                            text = (
                                delta.get("content")
                                if isinstance(delta, dict)
                                else choice.get("text")
                            )
                            if text is not None and not isinstance(text, str):
                                raise TypeError("text is not a string")
                            if text:
                                texts.append(text)
                            if other := _beside_text(choice, delta):
                                extras.append(other)
                            if ids is not None:
                                chunk_ids = _token_ids(choice.get("token_ids"))
                                if text:
                                    ids.extend(held)
                                    ids.extend(chunk_ids)
                                    held = []
                                else:
                                    held.extend(chunk_ids)
                                if prompt_ids is None and choice.get("prompt_token_ids"):
                                    prompt_ids = tuple(_token_ids(choice["prompt_token_ids"]))
                            if choice.get("finish_reason"):
                                finish = str(choice["finish_reason"])
                        prompt_tokens, completion_tokens = usage_tokens(
                            obj, prompt_tokens, completion_tokens
                        )
                    except Exception as exc:  # any shape the code above did not foresee
                        raise self.shape_error(obj) from exc
                if texts or extras or ids:
                    count = len(ids) if ids else max(len(texts), len(extras))
                    if predicted is not None and ids is None:
                        # Counts the tokens of a character the engine sent no chunk for.
                        count, counted = max(0, predicted - counted), max(counted, predicted)
                    yield TextDelta(
                        "".join(texts), count, tuple(extras), tuple(ids or ()), prompt_ids
                    )
                if held:
                    yield TextDelta("", len(held), (), tuple(held), prompt_ids)
                if done:
                    break
        yield self.stream_end(request, finish, prompt_tokens, completion_tokens)


def _token_ids(value: object) -> list[int]:
    """Return a list of token ids as sent (anything else: none)."""
    if isinstance(value, list) and all(type(t) is int for t in value):
        return value
    return []


_TEXT_KEYS = frozenset({"content", "role"})
_CHOICE_KEYS = frozenset(
    {"index", "delta", "text", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}
)


def _beside_text(choice: dict[str, Any], delta: object) -> dict[str, Any] | None:
    """Return what a choice event holds beside its text (None if nothing but nulls)."""
    other: dict[str, Any] = {}
    if isinstance(delta, dict):
        fields = {k: v for k, v in delta.items() if k not in _TEXT_KEYS and v not in (None, [])}
        if fields:
            other["delta"] = fields
    for key, value in choice.items():
        if key not in _CHOICE_KEYS and value is not None:
            other[key] = value
    if not other:
        return None
    other["index"] = choice.get("index", 0)
    return other
