"""Dispatch order through Envoy is the HTTP door's: the flood story and the fair shares."""

from __future__ import annotations

from ..backends.sim_flood import SIZES, assert_fairq_protects_the_light_user


async def test_flood_through_envoy_light_user_fast_power_user_unharmed() -> None:
    outcome = await assert_fairq_protects_the_light_user("vllm", door="envoy")
    print(f"\n[flood vllm sim, through Envoy, fairq its picker ({SIZES})]\n{outcome.describe()}")
    assert outcome.passed
