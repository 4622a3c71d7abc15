"""The vLLM adapter contract against a real vLLM (``pytest -m vllm``).

Same checks as the simulator's ``tests/backends/test_contract_sim.py``: what passes there and
fails here is a simulator fidelity bug (or the reverse, an adapter that only works on the sim).
"""

from __future__ import annotations

import pytest

from ..backends.contract import CHECKS, Check, VllmTarget, check_id
from .vllm_process import VllmProcess

# --max-model-len the fixture starts vLLM with (vllm_process._MAX_MODEL_LEN).
_MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def vllm_target(vllm_fcfs: VllmProcess) -> VllmTarget:
    return VllmTarget(vllm_fcfs.url, vllm_fcfs.model, _MAX_MODEL_LEN)


@pytest.mark.parametrize("check", CHECKS, ids=check_id)
async def test_vllm_adapter_contract(check: Check, vllm_target: VllmTarget) -> None:
    await check(vllm_target)
