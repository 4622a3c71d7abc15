"""Fair-share priority on a real vLLM with ``--scheduling-policy priority``.

fairq keeps a deep queue inside vLLM (``max_backend_waiting = 10``) for one power user. A
light user's request sent during that flood must start before the power requests already
waiting in vLLM when it got there. Registered with priority scheduling but without fair share
(the tier alone, the same for everyone), the same request starts behind them: vLLM orders one
priority by arrival.

Which power requests were waiting in vLLM is read from fairq's own events: dispatched
(``Started``) before the light request was, and no token yet at that moment. Requests started
in the same engine step as the light one may deliver their first token a hair earlier, so the
bounds leave one engine's worth of slots (``--max-num-seqs 4``) of slack either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import grpc
import httpx

import fairq
from fairq_bench.processes import fairq_process, toml_config

from .openai_http import flood_client, is_idle, metric_value, scrape_metrics, wait_for_metrics
from .test_fairq_vllm import _out_of_the_engines_way
from .vllm_process import VllmProcess

SLOTS = 4  # the fixture's --max-num-seqs
DEEP = '[[tiers]]\nname = "interactive"\nmax_backend_waiting = 10\n'


@dataclass
class Timeline:
    """When fairq reported a request dispatched, and when its first text arrived."""

    user: str
    started: float | None = None
    first: float | None = None


async def _generate(
    channel: grpc.aio.Channel, model: str, record: Timeline, max_tokens: int
) -> None:
    client = fairq.AsyncClient("", user=record.user, channel=channel)
    events = client.generate(model, f"{record.user}: tell me more", max_tokens=max_tokens)
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, fairq.Started):
                record.started = time.monotonic()
            elif isinstance(event, fairq.Chunk) and event.text and record.first is None:
                record.first = time.monotonic()


async def _light_during_flood(
    http: httpx.AsyncClient, url: str, model: str, fair_share: bool
) -> tuple[Timeline, list[Timeline]]:
    """Return the light request and the power requests waiting in vLLM when it was sent."""
    config = toml_config(url, model, "vllm", DEEP).replace(
        'models = ["tiny"]',
        'models = ["tiny"]\npriority_scheduling = true\n'
        f"fair_share_priority = {str(fair_share).lower()}",
    )
    await wait_for_metrics(http, url, is_idle)
    power = [Timeline("power") for _ in range(40)]
    light = Timeline("light")
    async with fairq_process(config) as target, grpc.aio.insecure_channel(target) as channel:
        tasks = [asyncio.create_task(_generate(channel, model, r, 300)) for r in power]
        try:
            await wait_for_metrics(
                http, url, lambda f: (metric_value(f, "vllm:num_requests_waiting") or 0) >= 8
            )
            await _generate(channel, model, light, 16)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert light.started is not None and light.first is not None
    waiting = [
        r
        for r in power
        if r.started is not None
        and r.started < light.started
        and (r.first is None or r.first > light.started)
    ]
    return light, waiting


def _went_first(light: Timeline, waiting: list[Timeline]) -> int:
    assert light.first is not None
    return sum(r.first is not None and r.first < light.first for r in waiting)


async def test_light_request_starts_before_power_requests_waiting_in_vllm(
    vllm_priority: VllmProcess,
) -> None:
    url, model = vllm_priority.url, vllm_priority.model
    with _out_of_the_engines_way():
        async with flood_client() as http:
            before = await scrape_metrics(http, url)
            light_on, waiting_on = await _light_during_flood(http, url, model, fair_share=True)
            light_off, waiting_off = await _light_during_flood(http, url, model, fair_share=False)
            after = await scrape_metrics(http, url)
    preempted = (metric_value(after, "vllm:num_preemptions_total") or 0) - (
        metric_value(before, "vllm:num_preemptions_total") or 0
    )
    on, off = _went_first(light_on, waiting_on), _went_first(light_off, waiting_off)
    assert light_on.first is not None and light_on.started is not None
    assert light_off.first is not None and light_off.started is not None
    print(
        f"\n[fair share] light request during a flood: with fair share {on} of "
        f"{len(waiting_on)} waiting power requests went first, TTFT after dispatch "
        f"{light_on.first - light_on.started:.3f} s; tier only {off} of {len(waiting_off)}, "
        f"{light_off.first - light_off.started:.3f} s; vLLM preemptions {preempted:.0f}"
    )
    assert len(waiting_on) >= 2 * SLOTS - 1 and len(waiting_off) >= 2 * SLOTS - 1
    assert on <= SLOTS - 1, "power requests waiting in vLLM started before the light one"
    assert off >= len(waiting_off) - (SLOTS - 1), "tier only: vLLM's queue is first come"
