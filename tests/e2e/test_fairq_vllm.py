"""fairq in front of a real vLLM: streaming, cancellation, tiers as priorities, and the flood.

fairq runs as its own process (``fairq serve``), as in production; the test process is the
client. The flood test measures direct-to-vLLM and through-fairq in the same run.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import grpc
import httpx

import fairq
from fairq_bench.processes import fairq_process, toml_config

from .conftest import OTHER_CPUS
from .flood import FloodConfig, SendFn, run_flood
from .openai_http import (
    completions_sender,
    flood_client,
    is_idle,
    metric_value,
    wait_for_metrics,
)
from .vllm_process import VllmProcess

FAST_POLL = "[scheduler]\npoll_interval_seconds = 0.05\n"
DEEP_STANDARD = "".join(
    f'[[tiers]]\nname = "{name}"\nmax_backend_waiting = {waiting}\n'
    for name, waiting in (("interactive", 16), ("standard", 12), ("batch", 0))
)


def fairq_send(
    channel: grpc.aio.Channel,
    model: str,
    tiers: Mapping[str, str] | None = None,
    *,
    chat: bool = False,
) -> SendFn:
    """A flood SendFn through fairq: one client per user on a shared channel.

    ``tiers`` maps a user to the tier it asks for (default: its ceiling); with ``chat`` the
    prompt goes as one user message.
    """
    clients: dict[str, fairq.AsyncClient] = {}

    async def send(user: str, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        client = clients.setdefault(user, fairq.AsyncClient("", user=user, channel=channel))
        tier = (tiers or {}).get(user, "")
        events = (
            client.generate(
                model, messages=[("user", prompt)], max_tokens=max_tokens, ignore_eos=True,
                tier=tier,
            )
            if chat
            else client.generate(model, prompt, max_tokens=max_tokens, ignore_eos=True, tier=tier)
        )  # fmt: skip
        finished = None
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, fairq.Chunk):
                    yield event.text
                elif isinstance(event, fairq.Finished):
                    finished = event
        assert finished is not None and finished.completion_tokens == max_tokens

    return send


async def test_streams_completion_and_chat_through_fairq(vllm_fcfs: VllmProcess) -> None:
    config = toml_config(vllm_fcfs.url, vllm_fcfs.model, "vllm", FAST_POLL)
    async with fairq_process(config) as target, fairq.AsyncClient(target, user="ann") as client:
        done = await client.complete(vllm_fcfs.model, "Hello there", max_tokens=12)
        assert done.text
        assert done.completion_tokens == 12
        assert done.finish_reason == "length"
        assert done.backend_id == "backend-0"
        chat = await client.complete(
            vllm_fcfs.model, messages=[("user", "Who goes next?")], max_tokens=8
        )
        assert chat.text
        assert chat.prompt_tokens > 0
        try:
            await client.complete("no-such-model", "x", max_tokens=2)
        except fairq.NotFoundError as exc:
            assert "no-such-model" in exc.message
        else:
            raise AssertionError("unknown model was accepted")


async def test_cancel_through_fairq_aborts_the_vllm_request(vllm_fcfs: VllmProcess) -> None:
    config = toml_config(vllm_fcfs.url, vllm_fcfs.model, "vllm", FAST_POLL)
    async with (
        httpx.AsyncClient(timeout=30) as http,
        fairq_process(config) as target,
        fairq.AsyncClient(target, user="cat") as client,
    ):
        await wait_for_metrics(http, vllm_fcfs.url, is_idle)
        events = client.generate(vllm_fcfs.model, "Tell me everything", max_tokens=400)
        async for event in events:
            if isinstance(event, fairq.Chunk):
                break
        running = await wait_for_metrics(
            http, vllm_fcfs.url, lambda f: metric_value(f, "vllm:num_requests_running") == 1
        )
        assert metric_value(running, "vllm:num_requests_running") == 1
        await events.aclose()  # the client cancels mid-stream
        after = await wait_for_metrics(http, vllm_fcfs.url, is_idle)
        assert metric_value(after, "vllm:num_requests_running") == 0


async def _flood(send: SendFn, config: FloodConfig) -> tuple[float, float, float]:
    result = await run_flood(send, config)
    assert result.light_submit_offset_s < config.light_delay_s + 0.5, "client was starved"
    return result.light_ttft_s, result.power_makespan_s, result.throughput_tok_s


@contextlib.contextmanager
def _out_of_the_engines_way() -> Iterator[None]:
    """Run the load generator and fairq (a child, so it inherits this) beside vLLM, not on it.

    vLLM is confined to ``ENGINE_CPUS`` (all its processes and threads); the load generator
    and fairq take the other cores, as a gateway runs on CPUs of its own in production.
    Direct and through-fairq runs get the same treatment.
    """
    cpus = os.sched_getaffinity(0)
    if OTHER_CPUS:
        os.sched_setaffinity(0, OTHER_CPUS)
    try:
        yield
    finally:
        os.sched_setaffinity(0, cpus)


Runs = list[tuple[float, float, float]]


async def _interleaved_floods(
    url: str, model: str, config: FloodConfig, rounds: int
) -> tuple[Runs, Runs]:
    """``rounds`` x (direct, fairq, fairq, direct): (light TTFT, makespan, throughput) by side."""
    # fairq's defaults. Polling faster does not help the light user (dispatch follows
    # fairq's own finish and first-token events between scrapes) and costs the backend:
    # each scrape of vLLM's /metrics takes its API server ~5 ms of CPU.
    fq = toml_config(url, model, "vllm")
    directs: Runs = []
    throughs: Runs = []
    async with flood_client() as http:
        for via_fairq in (False, True, True, False) * rounds:
            await wait_for_metrics(http, url, is_idle)
            if not via_fairq:
                directs.append(await _flood(completions_sender(http, url, model), config))
                continue
            async with fairq_process(fq) as target, grpc.aio.insecure_channel(target) as chan:
                throughs.append(await _flood(fairq_send(chan, model), config))
    return directs, throughs


def _mean(runs: Runs) -> tuple[float, float, float]:
    """Per-field mean of ``runs``."""
    return (
        statistics.fmean(r[0] for r in runs),
        statistics.fmean(r[1] for r in runs),
        statistics.fmean(r[2] for r in runs),
    )


async def test_flood_light_user_is_served_fast_and_power_user_loses_little(
    vllm_fcfs: VllmProcess,
) -> None:
    """The flood, four times each way, in rounds of direct, fairq, fairq, direct.

    vLLM runs alone on its core and fairq with the load generator on the other, so neither
    side's runs are slowed by the other's CPU use and both quantities are judged by their
    means. The light user's TTFT through fairq is about one engine wave (the requests fairq
    lets wait inside vLLM's own FIFO queue, ``max_backend_waiting``, go first); directly it
    is however many waves vLLM has queued when it arrives. With every vLLM process on one
    core, vLLM's API server takes in a flood slowly, so fewer waves are ahead of a direct
    light request than on a GPU host: measured 0.13-0.30x over 12 engine sizes and workloads
    (``docs/benchmarks/sweep-vllm.md``); the bound leaves margin for that spread.
    """
    # The reference flood, not TEST_FLOOD: at 150-token power requests the makespan ratio
    # measured 1.006x on a quiet machine but 1.186x (best 1.152x) under 50 % hypervisor steal,
    # where fairq's dispatch, twice as frequent, lags the engine; at 300 tokens 1.066-1.102x.
    config = FloodConfig()
    url, model = vllm_fcfs.url, vllm_fcfs.model
    with _out_of_the_engines_way():
        directs, throughs = await _interleaved_floods(url, model, config, rounds=2)
    direct, through = _mean(directs), _mean(throughs)
    ratio: Callable[[int], float] = lambda i: through[i] / direct[i]  # noqa: E731
    best_direct = min(r[1] for r in directs)
    best_through = min(r[1] for r in throughs)
    for name, runs in (("direct", directs), ("fairq ", throughs)):
        print(
            f"\n[flood] {name}: "
            + "; ".join(
                f"light TTFT {r[0]:.3f} s, makespan {r[1]:.2f} s, {r[2]:.0f} tok/s" for r in runs
            )
        )
    print(
        f"[flood] means, fairq/direct: light TTFT {ratio(0):.3f}x, "
        f"makespan {ratio(1):.3f}x, throughput {ratio(2):.3f}x; "
        f"best makespans {best_through:.2f} / {best_direct:.2f} s = "
        f"{best_through / best_direct:.3f}x"
    )
    assert through[0] <= direct[0] * 0.4, "light user not served at least 2.5x sooner"
    assert through[1] <= direct[1] * 1.15, "power user's mean makespan grew by more than 15%"


async def test_tier_reaches_vllm_as_priority(vllm_priority: VllmProcess) -> None:
    """With a priority-scheduling vLLM, an interactive request overtakes standard work that
    fairq already forwarded; registered without priority support, it waits behind it.

    The gates are opened wide (standard: 12 waiting, interactive above that) so plenty of work
    sits in vLLM's own queue, which is the situation priorities are for.
    """
    config = FloodConfig(power_requests=30)
    tiers = {config.power_user: "standard", config.light_user: "interactive"}
    url, model = vllm_priority.url, vllm_priority.model
    cpus = os.sched_getaffinity(0)
    if OTHER_CPUS:
        os.sched_setaffinity(0, OTHER_CPUS)
    light: dict[bool, float] = {}
    try:
        async with flood_client() as http:
            for priority in (False, True):
                await wait_for_metrics(http, url, is_idle)
                fq = toml_config(url, model, "vllm", FAST_POLL + DEEP_STANDARD).replace(
                    'models = ["tiny"]',
                    f'models = ["tiny"]\npriority_scheduling = {str(priority).lower()}',
                )
                async with fairq_process(fq) as target, grpc.aio.insecure_channel(target) as ch:
                    result = await run_flood(fairq_send(ch, model, tiers), config)
                assert result.light_submit_offset_s < config.light_delay_s + 0.5
                light[priority] = result.light_ttft_s
    finally:
        os.sched_setaffinity(0, cpus)
    print(f"\n[priority] light TTFT via fairq: fcfs-registered {light[False]:.3f} s, "
          f"priority-registered {light[True]:.3f} s")  # fmt: skip
    assert light[True] < 0.7 * light[False]
