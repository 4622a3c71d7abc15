"""Poller and the backend state it feeds: samples, windowed TPOT, health from failed scrapes.

A real poller scrapes a loopback server; its reports are applied to a :class:`BackendState`
exactly as the dispatcher applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence

import pytest
from aiohttp import web

from fairq_server.backends.poller import MetricsPoller, ScrapeResult
from fairq_server.backends.vllm import VllmBackend
from fairq_server.errors import BackendError
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.prefix import PrefixCache

from ...scripted_http import Handler, hang_up, reply, serve, unused_url

LOGGER = "fairq_server.scheduling.backend_state"


def metrics(waiting: int, running: int, tpot_sum: float, tpot_count: int) -> str:
    h = "vllm:request_time_per_output_token_seconds"
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        f'# TYPE {h} histogram\n{h}_bucket{{le="+Inf"}} {tpot_count}\n'
        f"{h}_sum {tpot_sum}\n{h}_count {tpot_count}\n"
    )


class Scripted:
    """Answers every request of the current scrape with the script's next handler.

    The script moves on when the poller reports a result, i.e. once per scrape, not once
    per request: when the server hangs up, aiohttp retries the GET once on a new connection,
    and that retry belongs to the same scrape (so it is hung up on as well).
    """

    def __init__(self, answers: Sequence[Handler]) -> None:
        self.answers = list(answers)

    def __call__(
        self, request: web.BaseRequest
    ) -> web.StreamResponse | Awaitable[web.StreamResponse]:
        return self.answers[0](request)

    def advance(self) -> None:
        self.answers.pop(0)


def ok(waiting: int = 0, running: int = 0, tpot_sum: float = 0, tpot_count: int = 0) -> Handler:
    return lambda request: reply(text=metrics(waiting, running, tpot_sum, tpot_count))


def boom(request: web.BaseRequest) -> web.Response:
    return reply(500, text="boom")


def applying(
    backend: VllmBackend, unhealthy_after: int = 2, on_result: object = None
) -> tuple[MetricsPoller, BackendState]:
    """A poller whose reports are applied to a fresh backend state, as the dispatcher does."""
    state = BackendState(backend, PrefixCache(16))

    def landed(backend_id: str, result: ScrapeResult) -> None:
        state.scrape_landed(result, unhealthy_after)
        if callable(on_result):
            on_result()

    poller = MetricsPoller(
        backend,
        interval=0.1,
        on_sent=lambda backend_id: state.scrape_sent(time.monotonic()),
        on_result=landed,
    )
    return poller, state


@contextlib.asynccontextmanager
async def scripted_poller(
    answers: Sequence[Handler], unhealthy_after_failures: int = 2
) -> AsyncIterator[tuple[MetricsPoller, BackendState, list[tuple[bool | None, int]]]]:
    """A poller over a loopback server answering each scrape with the next of ``answers``;
    the list records (healthy, consecutive failures) after every scrape."""
    script = Scripted(answers)
    seen: list[tuple[bool | None, int]] = []

    async with serve(script) as url:
        backend = VllmBackend("v", url, ["m"])

        def record() -> None:
            seen.append((state.healthy, state.consecutive_failures))
            script.advance()

        poller, state = applying(backend, unhealthy_after_failures, record)
        try:
            yield poller, state, seen
        finally:
            await backend.aclose()


async def test_tpot_is_measured_over_the_last_window() -> None:
    script = [
        ok(0, 1, 10.0, 100),  # long history: 100 ms / token
        ok(2, 4, 10.2, 110),  # last window: 20 ms / token
        ok(2, 4, 10.2, 110),  # no completion, still running
    ]
    async with scripted_poller(script) as (poller, load, updates):
        await poller.poll_once()
        assert load.sample is not None and load.tpot_seconds is None
        load.awaiting_first_token = 3
        await poller.poll_once()
        assert load.tpot_seconds is not None
        assert abs(load.tpot_seconds - 0.02) < 1e-9
        assert load.sample.waiting == 2
        assert load.awaiting_mark == 3
        await poller.poll_once()
        assert abs((load.tpot_seconds or 0) - 0.02) < 1e-9
        assert len(updates) == 3
        assert load.healthy is True


async def test_failing_metrics_keep_old_snapshot_and_mark_unhealthy() -> None:
    """Consecutive failures up to the default threshold (2): the old snapshot stays in place
    to go stale, and the backend is then marked unhealthy."""
    async with scripted_poller([ok(), boom, boom]) as (poller, load, _):
        await poller.poll_once()
        first = load.sample
        await poller.poll_once()
        await poller.poll_once()
        assert load.sample is first
        assert load.healthy is False
        assert "HTTP 500" in load.last_error


@pytest.mark.parametrize("failure", [hang_up, boom], ids=["hang-up", "http-500"])
async def test_one_failed_scrape_between_good_ones_keeps_the_backend_healthy(
    failure: Handler, caplog: pytest.LogCaptureFixture
) -> None:
    """A single scrape that fails (here the server drops the connection or answers 500; in
    production typically a timeout while the event loop stalls) is logged and counted, but
    does not take the backend out of dispatch; its snapshot still ages."""
    async with scripted_poller([ok(), failure, ok(waiting=2)]) as (poller, load, seen):
        await poller.poll_once()
        first = load.sample
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            await poller.poll_once()
        assert load.healthy is True
        assert load.sample is first  # left to go stale: the gate still fails closed on age
        assert load.failures == 1 and load.consecutive_failures == 1
        assert load.last_error
        assert "scrape failed (1 of 2" in caplog.text and "backend v" in caplog.text
        await poller.poll_once()
        assert load.healthy is True and load.consecutive_failures == 0
        assert load.sample is not first and load.sample is not None
        assert load.sample.waiting == 2
        assert seen == [(True, 0), (True, 1), (True, 0)]


async def test_n_consecutive_failures_mark_the_backend_unhealthy_until_a_scrape_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = [ok(), hang_up, hang_up, ok(), hang_up, hang_up, hang_up, hang_up, ok()]
    async with scripted_poller(script, unhealthy_after_failures=3) as (poller, load, seen):
        await poller.poll_once()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for _ in range(2):
                await poller.poll_once()
            assert load.healthy is True
            await poller.poll_once()  # success: the count starts again
            for _ in range(2):
                await poller.poll_once()
            assert load.healthy is True
            await poller.poll_once()  # third in a row
            assert load.healthy is False
            assert "unhealthy after 3 failed scrape(s)" in caplog.text
            await poller.poll_once()  # still failing: stays unhealthy
        assert load.failures == 6
        await poller.poll_once()
        assert load.healthy is True
    assert [h for h, _ in seen] == [True, True, True, True, True, True, False, False, True]
    # Every failed update is visible to telemetry (one failure count per failed scrape).
    assert sum(1 for _, n in seen if n) == 6


async def test_a_backend_that_never_answered_is_unhealthy_at_its_first_failure() -> None:
    """Nothing to protect yet: a backend registered while down is refused at once."""
    backend = VllmBackend("v", unused_url(), ["m"])  # connection refused
    try:
        poller, load = applying(backend)
        await poller.poll_once()
        assert load.healthy is False
    finally:
        await backend.aclose()


async def test_a_failed_request_keeps_the_backend_suspect_through_a_tolerated_failure() -> None:
    """The dispatcher marks a backend it could not reach unhealthy until the next successful
    scrape; a failed scrape below the threshold does not clear that."""
    async with scripted_poller([ok(), boom, ok()]) as (poller, load, _):
        await poller.poll_once()
        load.suspect()  # as the dispatcher's retry path does
        await poller.poll_once()
        assert load.healthy is False
        await poller.poll_once()
        assert load.healthy is True


async def test_a_scrape_may_take_as_long_as_the_configured_timeout() -> None:
    """``scheduler.scrape_timeout_seconds`` replaces the default bound (five intervals, at
    least 1 s): metrics answered after 1.5 s are a successful scrape under a 10 s timeout."""

    async def late(request: web.BaseRequest) -> web.Response:
        await asyncio.sleep(1.5)  # a slow exporter, past the default 1 s bound
        return reply(text=metrics(1, 2, 0.0, 0))

    async with scripted_poller([late]) as (poller, state, seen):
        poller.timeout = 10.0
        result = await poller.poll_once()
    assert not isinstance(result, BackendError), result
    assert state.sample is not None and state.sample.running == 2
    assert seen == [(True, 0)]
