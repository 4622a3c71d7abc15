"""Real vLLM with ``--scheduling-policy priority``: the backend half of fairq's tiers.

fairq passes a request's tier as vLLM's ``priority`` (lower is served earlier). This pins that
a priority-scheduled vLLM really lets such a request overtake a queued flood, and shows how far
that alone gets: the light request still waits for a running slot to free up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .flood import TEST_FLOOD, measure_alone, run_flood
from .openai_http import completions_sender, flood_client, is_idle, wait_for_metrics
from .vllm_process import VllmProcess

pytestmark = pytest.mark.vllm


async def test_priority_policy_lets_light_user_overtake_the_flood(
    vllm_priority: VllmProcess,
) -> None:
    config = TEST_FLOOD
    async with flood_client() as client:
        await wait_for_metrics(client, vllm_priority.url, is_idle)
        power = completions_sender(
            client, vllm_priority.url, vllm_priority.model, extra_body={"priority": 10}
        )
        light = completions_sender(
            client, vllm_priority.url, vllm_priority.model, extra_body={"priority": 0}
        )

        def send(user: str, prompt: str, max_tokens: int) -> AsyncIterator[str]:
            return (light if user == config.light_user else power)(user, prompt, max_tokens)

        alone_s = await measure_alone(send, config)
        result = await run_flood(send, config)

    print(
        f"\n[flood priority] light TTFT alone {alone_s * 1000:.1f} ms; {result.summary()}; "
        f"{result.light_ttft_s / alone_s:.0f}x alone"
    )
    assert result.light_submit_offset_s < config.light_delay_s + 0.5, "client was starved"
    # FIFO would put the light request behind ~56 queued requests (~90% of the makespan);
    # with priority it only waits for the next free running slot.
    assert result.light_ttft_s < 0.25 * result.power_makespan_s
