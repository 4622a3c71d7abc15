"""TgiBackend against the simulator in TGI mode: streaming, metrics, errors, the flood.

There is no real TGI in this project's test machines, so the simulator (whose TGI wire format
is pinned by ``tests/sim/test_tgi_http.py`` and the official clients) stands in for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import httpx
import pytest

from fairq_server.backends.request import (
    BackendRequest,
    MetricsSample,
    Sampling,
    StreamEnd,
    TextDelta,
)
from fairq_server.backends.tgi import TgiBackend
from fairq_server.doors.grpc.status import status_for
from fairq_server.errors import BackendError
from fairq_sim import SimConfig, SimServer

from ..scripted_http import RecordingProxy
from .contract import metric_value
from .sim_flood import SIZES, assert_fairq_protects_the_light_user

MODEL = "tgi-sim"
SLOTS = 2
# TGI reports validation and overload errors of a stream as an event on an HTTP 200, so the
# status code must come from the event's error_type.


@pytest.fixture
async def tgi() -> AsyncIterator[SimServer]:
    """A TGI-mode simulator at speed 1 with two batch slots (a queue builds at the third)."""
    config = SimConfig(mode="tgi", model=MODEL, profile="tiny-cpu", max_num_seqs=SLOTS)
    async with SimServer(config) as sim:
        yield sim


@pytest.fixture
async def backend(tgi: SimServer) -> AsyncIterator[TgiBackend]:
    adapter = TgiBackend("tgi-0", tgi.url, [MODEL])
    yield adapter
    await adapter.aclose()


def prompt(max_tokens: int) -> BackendRequest:
    return BackendRequest(
        model=MODEL, prompt="Who goes next?", sampling=Sampling(max_tokens=max_tokens)
    )


def chat(max_tokens: int) -> BackendRequest:
    return BackendRequest(
        model=MODEL,
        messages=(("system", "Be brief."), ("user", "Who goes next?")),
        sampling=Sampling(max_tokens=max_tokens),
    )


async def drain(backend: TgiBackend, request: BackendRequest) -> tuple[list[TextDelta], StreamEnd]:
    *deltas, end = [e async for e in backend.stream(request, 0)]
    assert isinstance(end, StreamEnd), end
    assert all(isinstance(d, TextDelta) for d in deltas)
    return [d for d in deltas if isinstance(d, TextDelta)], end


async def drain_recorded(
    tgi: SimServer, request: BackendRequest
) -> tuple[list[TextDelta], StreamEnd, tuple[str, dict[str, Any]]]:
    """Stream ``request`` through a recording proxy; also return the one POST it sent."""
    async with RecordingProxy(tgi.url) as proxy:
        backend = TgiBackend("tgi-0", proxy.url, [MODEL])
        try:
            deltas, end = await drain(backend, request)
        finally:
            await backend.aclose()
    [post] = proxy.posts
    return deltas, end, post


async def poll(
    scrape: Callable[[], Awaitable[MetricsSample]],
    condition: Callable[[MetricsSample], bool],
    timeout_s: float = 10.0,
) -> MetricsSample:
    """Scrape until ``condition`` holds (the engine updates its gauges between steps)."""
    deadline = time.monotonic() + timeout_s
    while not condition(sample := await scrape()):
        assert time.monotonic() < deadline, f"metrics never satisfied the condition: {sample}"
        await asyncio.sleep(0.01)
    return sample


# --- streaming -------------------------------------------------------------------------------


async def test_prompt_streams_via_generate_stream(tgi: SimServer) -> None:
    deltas, end, (path, body) = await drain_recorded(tgi, prompt(12))
    assert path == "/generate_stream"
    assert body["inputs"] == "Who goes next?"
    assert body["parameters"] == {"max_new_tokens": 12, "details": True}
    assert "".join(d.text for d in deltas)
    assert sum(d.tokens for d in deltas) == 12  # the simulator's tokens are never special
    assert end == StreamEnd("length", end.prompt_tokens, 12)
    assert end.prompt_tokens > 0  # from details.input_length


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [
        # TGI samples only with do_sample or a "warper"; temperature 1.0 alone is no warper.
        (1.0, {"temperature": 1.0, "do_sample": True}),
        (0.7, {"temperature": 0.7, "do_sample": True}),
        # Greedy: TGI rejects temperature 0, and must not get do_sample either.
        (0.0, {}),
    ],
)
async def test_prompt_sampling_parameters(
    tgi: SimServer, temperature: float, expected: dict[str, object]
) -> None:
    request = BackendRequest(
        model=MODEL, prompt="x", sampling=Sampling(max_tokens=2, temperature=temperature)
    )
    _, end, (_, body) = await drain_recorded(tgi, request)
    assert body["parameters"] == {"max_new_tokens": 2, "details": True, **expected}
    assert end.completion_tokens == 2  # and the backend accepted them


async def test_chat_streams_via_messages_api(tgi: SimServer) -> None:
    deltas, end, (path, body) = await drain_recorded(tgi, chat(10))
    assert path == "/v1/chat/completions"
    assert body["messages"][1] == {"role": "user", "content": "Who goes next?"}
    assert body["stream_options"] == {"include_usage": True}
    assert "".join(d.text for d in deltas)
    assert end.finish_reason == "length"
    assert end.completion_tokens == 10  # from the usage chunk
    assert end.prompt_tokens > 0


async def test_closing_the_stream_frees_the_batch_slot(tgi: SimServer, backend: TgiBackend) -> None:
    events = backend.stream(prompt(400), 0)
    assert isinstance(await anext(events), TextDelta)
    assert tgi.engine.num_running == 1
    await events.aclose()
    after = await poll(lambda: backend.scrape(5.0), lambda s: s.running == 0)
    assert after.waiting == 0
    assert tgi.state.in_flight == 0  # TGI's concurrency permit was released too


# --- metrics (the gate's inputs) ---------------------------------------------------------------


async def test_fresh_server_without_series_reads_as_idle(
    tgi: SimServer, backend: TgiBackend
) -> None:
    # TGI exports a series only after first use; an idle server is not a broken endpoint.
    sample = await backend.scrape(5.0)
    assert sample == MetricsSample(
        waiting=0.0, running=0.0, kv_usage=None, missing=(("kv_usage", ""),)
    )


async def test_queue_and_batch_gauges_while_busy(tgi: SimServer, backend: TgiBackend) -> None:
    total = SLOTS + 3
    streams = [asyncio.create_task(drain(backend, prompt(400))) for _ in range(total)]
    try:
        busy = await poll(
            lambda: backend.scrape(5.0), lambda s: (s.waiting, s.running) == (3, SLOTS)
        )
        # Ground truth: the engine itself (400-token requests are far from done).
        assert (tgi.engine.num_waiting, tgi.engine.num_running) == (3, SLOTS)
        assert busy.kv_usage is None  # TGI exports no KV-cache usage
    finally:
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    idle = await poll(lambda: backend.scrape(5.0), lambda s: (s.waiting, s.running) == (0, 0))
    assert idle.tpot_count == 0  # aborted requests are not observed in the TPOT histogram


async def test_tpot_histogram_counts_each_finished_request(
    tgi: SimServer, backend: TgiBackend
) -> None:
    before = await backend.scrape(5.0)
    await drain(backend, prompt(20))
    after = await poll(lambda: backend.scrape(5.0), lambda s: s.tpot_count > before.tpot_count)
    assert after.tpot_count - before.tpot_count == 1
    mean = (after.tpot_sum - before.tpot_sum) / (after.tpot_count - before.tpot_count)
    # A step at batch 1 cannot be faster than the profile says (the clock only runs late).
    assert mean >= 0.9 * tgi.state.profile.step_seconds(1, 0)
    assert mean < 0.15, "the gate's default TPOT limit would refuse an idle backend"


async def test_parse_metrics_matches_prometheus(tgi: SimServer, backend: TgiBackend) -> None:
    await drain(backend, prompt(4))  # brings every series into existence
    events = backend.stream(prompt(400), 0)
    try:
        assert isinstance(await anext(events), TextDelta)
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"{tgi.url}/metrics")).text
    finally:
        await events.aclose()
    sample = backend.parse_metrics(text)
    assert sample.waiting == metric_value(text, "tgi_queue_size") == 0
    assert sample.running == metric_value(text, "tgi_batch_current_size") == 1
    tpot = "tgi_request_mean_time_per_token_duration"
    assert sample.tpot_count == metric_value(text, f"{tpot}_count") == 1
    assert sample.tpot_sum == metric_value(text, f"{tpot}_sum")


# --- errors ------------------------------------------------------------------------------------


async def _error_of(backend: TgiBackend, request: BackendRequest) -> BackendError:
    with pytest.raises(BackendError) as info:
        await drain(backend, request)
    return info.value


async def test_validation_error_event_is_a_clear_error(backend: TgiBackend) -> None:
    # TGI validates inside the stream: HTTP 200, then {"error", "error_type": "validation"}.
    error = await _error_of(backend, prompt(10_000))
    assert "Input validation error" in str(error)
    assert "`max_new_tokens` must be <= 512" in str(error)
    assert not error.retryable


async def test_chat_validation_error_event_is_a_clear_error(backend: TgiBackend) -> None:
    # The Messages API nests it: {"error": {"message", "http_status_code": 422}}.
    error = await _error_of(backend, chat(10_000))
    assert "Input validation error" in str(error)
    assert not error.retryable


async def test_validation_error_event_is_invalid_argument(backend: TgiBackend) -> None:
    error = await _error_of(backend, prompt(10_000))
    assert status_for(error)[0] == grpc.StatusCode.INVALID_ARGUMENT


async def _overloaded_error(
    tgi: SimServer, backend: TgiBackend, refused: BackendRequest | None = None
) -> BackendError:
    tgi.config.max_concurrent_requests = 1
    holder = backend.stream(prompt(400), 0)
    try:
        assert isinstance(await anext(holder), TextDelta)
        error = await _error_of(backend, refused or prompt(4))
        # The request holding the only permit is unaffected.
        assert isinstance(await anext(holder), TextDelta)
    finally:
        await holder.aclose()
    return error


async def test_overloaded_event_is_a_clear_error(tgi: SimServer, backend: TgiBackend) -> None:
    error = await _overloaded_error(tgi, backend)
    assert "Model is overloaded" in str(error)
    assert tgi.engine.num_waiting == 0  # refused at the door, never queued


async def test_overloaded_event_is_retryable_resource_exhausted(
    tgi: SimServer, backend: TgiBackend
) -> None:
    error = await _overloaded_error(tgi, backend)
    assert status_for(error)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.retryable


async def test_overloaded_chat_event_is_retryable_resource_exhausted(
    tgi: SimServer, backend: TgiBackend
) -> None:
    error = await _overloaded_error(tgi, backend, chat(4))
    assert "Model is overloaded" in str(error)
    assert status_for(error)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.retryable


async def test_http_500_before_the_stream_is_retryable_unavailable(
    tgi: SimServer, backend: TgiBackend
) -> None:
    tgi.config.error_rate = 1.0  # answered {"error", "error_type": "incomplete_generation"}
    error = await _error_of(backend, prompt(4))
    assert status_for(error)[0] == grpc.StatusCode.UNAVAILABLE
    assert error.retryable
    assert "HTTP 500" in str(error)
    assert "Incomplete generation" in str(error)


async def test_stream_cut_mid_generation_is_an_error_not_a_short_answer(
    tgi: SimServer, backend: TgiBackend
) -> None:
    tgi.config.drop_after_tokens = 3  # connection closed without a final event
    with pytest.raises(BackendError):
        await drain(backend, prompt(20))


# --- the flood ---------------------------------------------------------------------------------


async def test_flood_tgi_sim_light_user_fast_power_user_unharmed() -> None:
    outcome = await assert_fairq_protects_the_light_user("tgi")
    print(f"\n[flood tgi sim ({SIZES})]\n{outcome.describe()}")
    assert outcome.passed
