"""Poller: snapshots, windowed TPOT from histogram deltas, failing metrics."""

from __future__ import annotations

import httpx

from fairq_server.backends.poller import MetricsPoller
from fairq_server.backends.vllm import VllmBackend
from fairq_server.scheduling.gate import BackendLoad


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
    def __init__(self, answers: list[httpx.Response]) -> None:
        self.answers = answers

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return self.answers.pop(0)


async def test_tpot_is_measured_over_the_last_window() -> None:
    script = Scripted(
        [
            httpx.Response(200, text=metrics(0, 1, 10.0, 100)),  # long history: 100 ms / token
            httpx.Response(200, text=metrics(2, 4, 10.2, 110)),  # last window: 20 ms / token
            httpx.Response(200, text=metrics(2, 4, 10.2, 110)),  # no completion, still running
        ]
    )
    backend = VllmBackend("v", "http://v", ["m"], transport=httpx.MockTransport(script))
    load = BackendLoad()
    updates: list[object] = []
    poller = MetricsPoller(backend, load, interval=0.1, on_update=updates.append)
    await poller.poll_once()
    assert load.snapshot is not None and load.snapshot.tpot_seconds is None
    load.dispatched = 3
    await poller.poll_once()
    assert load.snapshot.tpot_seconds is not None
    assert abs(load.snapshot.tpot_seconds - 0.02) < 1e-9
    assert load.snapshot.waiting == 2
    assert load.snapshot.dispatched_mark == 3
    await poller.poll_once()
    assert abs((load.snapshot.tpot_seconds or 0) - 0.02) < 1e-9
    assert len(updates) == 3
    assert poller.healthy is True


async def test_failing_metrics_keep_old_snapshot_and_mark_unhealthy() -> None:
    script = Scripted(
        [httpx.Response(200, text=metrics(0, 0, 0, 0)), httpx.Response(500, text="boom")]
    )
    backend = VllmBackend("v", "http://v", ["m"], transport=httpx.MockTransport(script))
    load = BackendLoad()
    poller = MetricsPoller(backend, load, interval=0.1)
    await poller.poll_once()
    first = load.snapshot
    await poller.poll_once()
    assert load.snapshot is first
    assert poller.healthy is False
    assert "HTTP 500" in poller.last_error
