"""The vLLM adapter contract: what :class:`VllmBackend` must do against any vLLM-like server.

The same checks run against the simulator in vLLM mode (``test_contract_sim.py``, fast suite)
and against a real vLLM (``tests/e2e/test_adapter_contract.py``, ``pytest -m vllm``), so the
simulator cannot drift from the engine it stands in for without one of the two failing.

Each check is a coroutine taking a :class:`VllmTarget`; entry points parametrize over
:data:`CHECKS`. A target must be otherwise idle while a check runs (no other client), because
some checks read the backend's global counters.

Backend state is observed through its own ``/metrics``, parsed here with ``prometheus_client``
independently of the adapter's parser, and polled with a deadline because the backend updates
its gauges asynchronously to the HTTP responses it sends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairq_server.backends.request import (
    BackendRequest,
    MetricsSample,
    Sampling,
    StreamEnd,
    StreamEvent,
    TextDelta,
)
from fairq_server.backends.vllm import VllmBackend
from fairq_server.doors.grpc.status import status_for
from fairq_server.errors import BackendError

from ..scripted_http import RecordingProxy

__all__ = [
    "CHECKS",
    "VllmTarget",
    "metric_value",
    "wait_for_metrics",
]

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_GENERATED = "vllm:generation_tokens_total"
# Long enough that the request is still generating when the test closes the stream, short
# enough to fit the 512-token context of both the tiny model and the tiny-cpu profile.
_LONG_TOKENS = 400


@dataclass(frozen=True)
class VllmTarget:
    """A vLLM-compatible server under test.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:8000``.
        model: the served model name.
        max_model_len: the server's context length.
    """

    base_url: str
    model: str
    max_model_len: int

    def backend(self, **kw: Any) -> VllmBackend:
        """A fresh adapter for this server (close it with ``aclose``)."""
        return VllmBackend("contract", self.base_url, [self.model], **kw)

    def prompt(self, max_tokens: int, **kw: Any) -> BackendRequest:
        """A prompt request for exactly ``max_tokens`` tokens."""
        return BackendRequest(
            model=kw.pop("model", self.model),
            prompt="Who should the scheduler serve next?",
            sampling=Sampling(max_tokens=max_tokens, ignore_eos=True, **kw),
        )

    def chat(self, max_tokens: int) -> BackendRequest:
        """A chat request for exactly ``max_tokens`` tokens."""
        return BackendRequest(
            model=self.model,
            messages=(("system", "Be brief."), ("user", "Who goes next?")),
            sampling=Sampling(max_tokens=max_tokens, ignore_eos=True),
        )


def metric_value(text: str, sample: str) -> float | None:
    """Sum of the samples named ``sample`` over all label sets; None when absent."""
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample
    ]
    return sum(values) if values else None


async def wait_for_metrics(
    base_url: str, condition: Callable[[str], bool], *, timeout_s: float = 30.0
) -> str:
    """Scrape ``/metrics`` until ``condition(text)`` holds; return that text.

    Raises:
        AssertionError: Still false at the deadline; the message shows running/waiting.
    """
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10.0) as http:
        while True:
            response = await http.get(f"{base_url}/metrics")
            response.raise_for_status()
            if condition(response.text):
                return response.text
            if time.monotonic() > deadline:
                running = metric_value(response.text, _RUNNING)
                waiting = metric_value(response.text, _WAITING)
                raise AssertionError(
                    f"metrics condition still false after {timeout_s} s "
                    f"(running={running}, waiting={waiting})"
                )
            await asyncio.sleep(0.02)  # poll interval of a foreign process, not a sync point


def _idle(text: str) -> bool:
    return metric_value(text, _RUNNING) == 0 and metric_value(text, _WAITING) == 0


async def _collect(events: AsyncIterator[StreamEvent]) -> tuple[list[TextDelta], StreamEnd]:
    """Drain a stream; it must be text deltas followed by exactly one final StreamEnd."""
    items = [e async for e in events]
    assert items, "empty stream"
    *deltas, end = items
    assert isinstance(end, StreamEnd), f"last event is {end!r}, not a StreamEnd"
    assert all(isinstance(d, TextDelta) for d in deltas), items
    return [d for d in deltas if isinstance(d, TextDelta)], end


def _assert_complete(deltas: Sequence[TextDelta], end: StreamEnd, max_tokens: int) -> None:
    assert "".join(d.text for d in deltas), "no text streamed"
    assert all(d.tokens >= 1 for d in deltas)
    # A delta can hold several tokens (merged reads); the backend may also send a token whose
    # text is still incomplete UTF-8, so deltas carry at most, not exactly, max_tokens.
    assert sum(d.tokens for d in deltas) <= max_tokens
    assert end.completion_tokens == max_tokens
    assert end.prompt_tokens > 0
    assert end.finish_reason == "length"


async def check_prompt_stream(target: VllmTarget) -> None:
    """A prompt streams text, then one StreamEnd with exact usage and finish 'length'."""
    backend = target.backend()
    try:
        deltas, end = await _collect(backend.stream(target.prompt(12), 0))
    finally:
        await backend.aclose()
    _assert_complete(deltas, end, 12)


async def check_chat_stream(target: VllmTarget) -> None:
    """A chat request streams text, then one StreamEnd with exact usage and finish 'length'."""
    backend = target.backend()
    try:
        deltas, end = await _collect(backend.stream(target.chat(10), 0))
    finally:
        await backend.aclose()
    _assert_complete(deltas, end, 10)


async def check_metrics_while_running(target: VllmTarget) -> None:
    """``parse_metrics`` reads running/waiting/KV as Prometheus itself does, mid-request."""
    await wait_for_metrics(target.base_url, _idle)
    backend = target.backend()
    events = backend.stream(target.prompt(_LONG_TOKENS), 0)
    try:
        assert isinstance(await anext(events), TextDelta)
        text = await wait_for_metrics(
            target.base_url, lambda t: (metric_value(t, _RUNNING) or 0) >= 1
        )
        sample = backend.parse_metrics(text)
        assert sample.running == metric_value(text, _RUNNING) == 1
        assert sample.waiting == metric_value(text, _WAITING) == 0
        assert sample.kv_usage is not None
        assert 0.0 < sample.kv_usage <= 1.0, "a running request holds KV blocks"
    finally:
        await events.aclose()
        await backend.aclose()
    await wait_for_metrics(target.base_url, _idle)


async def check_scrape_counts_tpot(target: VllmTarget) -> None:
    """After one finished request, a scrape shows it in the TPOT histogram and nothing queued."""
    backend = target.backend()
    try:
        await wait_for_metrics(target.base_url, _idle)
        before = await backend.scrape(5.0)
        # vLLM (and the simulator in its mode) answers the samples asked for by name: the
        # scrape stays filtered (a fallback to the whole exposition would have switched it off).
        assert backend.metrics_filtered is bool(backend.metrics_filter)
        await _collect(backend.stream(target.prompt(8), 0))

        # The histogram is observed when the engine retires the request, which may be just
        # after the last SSE event went out: poll the backend rather than assume an order.
        async def counted() -> MetricsSample:
            deadline = time.monotonic() + 30.0
            while (sample := await backend.scrape(5.0)).tpot_count <= before.tpot_count:
                assert time.monotonic() < deadline, "TPOT histogram never counted the request"
                await asyncio.sleep(0.02)
            return sample

        after = await counted()
    finally:
        await backend.aclose()
    assert after.tpot_count - before.tpot_count == 1
    assert after.tpot_sum > before.tpot_sum
    assert (after.waiting, after.running) == (0, 0)


async def check_unknown_model_is_not_found(target: VllmTarget) -> None:
    """An unknown model is NOT_FOUND, not retryable, and keeps the backend's own message."""
    backend = target.backend()
    try:
        with pytest.raises(BackendError) as info:
            await _collect(backend.stream(target.prompt(4, model="no-such-model"), 0))
    finally:
        await backend.aclose()
    error = info.value
    assert status_for(error)[0] == grpc.StatusCode.NOT_FOUND
    assert not error.retryable
    assert "HTTP 404" in str(error)
    assert "`no-such-model` does not exist" in str(error)


async def check_max_tokens_over_context_is_invalid_argument(target: VllmTarget) -> None:
    """max_tokens beyond max_model_len is INVALID_ARGUMENT with the backend's explanation."""
    backend = target.backend()
    too_many = target.max_model_len + 1
    try:
        with pytest.raises(BackendError) as info:
            await _collect(backend.stream(target.prompt(too_many), 0))
    finally:
        await backend.aclose()
    error = info.value
    assert status_for(error)[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert not error.retryable
    assert "HTTP 400" in str(error)
    assert f"max_model_len={target.max_model_len}" in str(error)


async def check_early_close_aborts_the_request(target: VllmTarget) -> None:
    """Closing the stream after the first text frees the backend slot: running drops to 0."""
    before = await wait_for_metrics(target.base_url, _idle)
    generated_before = metric_value(before, _GENERATED)
    assert generated_before is not None
    backend = target.backend()
    events = backend.stream(target.prompt(_LONG_TOKENS), 0)
    try:
        assert isinstance(await anext(events), TextDelta)
        await events.aclose()
        after = await wait_for_metrics(target.base_url, _idle)
    finally:
        await backend.aclose()
    generated = metric_value(after, _GENERATED)
    assert generated is not None
    # Fewer tokens than asked for: the request was aborted, it did not just run to its end.
    assert generated - generated_before < _LONG_TOKENS


async def check_priority_field_accepted(target: VllmTarget) -> None:
    """A priority-scheduling adapter sends ``priority`` and the server accepts it."""
    async with RecordingProxy(target.base_url) as proxy:
        backend = VllmBackend("contract", proxy.url, [target.model], priority_scheduling=True)
        try:
            deltas, end = await _collect(backend.stream(target.prompt(6), 3))
        finally:
            await backend.aclose()
    assert [b.get("priority") for b in proxy.bodies] == [3]
    _assert_complete(deltas, end, 6)


Check = Callable[[VllmTarget], Awaitable[None]]

CHECKS: tuple[Check, ...] = (
    check_prompt_stream,
    check_chat_stream,
    check_metrics_while_running,
    check_scrape_counts_tpot,
    check_unknown_model_is_not_found,
    check_max_tokens_over_context_is_invalid_argument,
    check_early_close_aborts_the_request,
    check_priority_field_accepted,
)
"""Every contract check; entry points parametrize over these (ids: the function names)."""


def check_id(check: Check) -> str:
    """Test id of a check: its name without the ``check_`` prefix."""
    return getattr(check, "__name__", "check").removeprefix("check_")
