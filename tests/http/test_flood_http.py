"""The flood story through the HTTP door: the light user's TTFT vs straight to the backend.

The same workload, bounds and sizes as the gRPC flood on the simulator
(:mod:`tests.backends.sim_flood`); the requests go to fairq's ``/v1/completions`` with the
user in the body's ``user`` field.
"""

from __future__ import annotations

from ..backends.sim_flood import SIZES, assert_fairq_protects_the_light_user


async def test_flood_through_http_door_light_user_fast_power_user_unharmed() -> None:
    outcome = await assert_fairq_protects_the_light_user("vllm", door="http")
    print(f"\n[flood vllm sim, HTTP door ({SIZES})]\n{outcome.describe()}")
    assert outcome.passed
