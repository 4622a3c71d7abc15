"""The flood story on the simulator in vLLM mode: fairq serves the light user >= 10x sooner.

Sizes and why: see :mod:`tests.backends.sim_flood`. The TGI-mode twin is in ``test_tgi.py``.
"""

from __future__ import annotations

from .sim_flood import SIZES, assert_fairq_protects_the_light_user


async def test_flood_vllm_sim_light_user_fast_power_user_unharmed() -> None:
    outcome = await assert_fairq_protects_the_light_user("vllm")
    print(f"\n[flood vllm sim ({SIZES})]\n{outcome.describe()}")
    assert outcome.passed


async def test_flood_sglang_sim_light_user_fast_power_user_unharmed() -> None:
    """The same story in front of the simulator's SGLang mode (kind openai, preset sglang)."""
    outcome = await assert_fairq_protects_the_light_user("sglang")
    print(f"\n[flood sglang sim ({SIZES})]\n{outcome.describe()}")
    assert outcome.passed
