"""The vLLM adapter contract against the simulator in vLLM mode (fast suite).

The real-vLLM twin is ``tests/e2e/test_adapter_contract.py``; both run :data:`contract.CHECKS`.
The simulator runs at speed 1 with the ``tiny-cpu`` profile (the context length and step
times of the real tiny model), so a 400-token request is still generating when a check
closes its stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fairq_sim import SimConfig, SimServer

from .contract import CHECKS, Check, VllmTarget, check_id


@pytest.fixture(scope="module")
async def sim_target() -> AsyncIterator[VllmTarget]:
    config = SimConfig(mode="vllm", model="tiny", profile="tiny-cpu", max_num_seqs=4)
    async with SimServer(config) as sim:
        yield VllmTarget(sim.url, "tiny", sim.state.profile.max_model_len)


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
async def test_vllm_adapter_contract_on_sim(check: Check, sim_target: VllmTarget) -> None:
    await check(sim_target)
