"""Floods for the cluster's fairness tests: every request queued before the backend serves.

These tests' client shares one event loop with the replicas and the backend, so a flood's
calls arrive over a while; a fast backend serves the first ones as they come, and the first
turns follow arrival order instead of fairness (one process gave a1 all its 40 turns, then a2
all its 40). :func:`flood` holds the backend slow until every call is queued somewhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from fairq_server.app import FairqServer
from fairq_sim import SimServer
from tests.reliability.helpers import fairq_metric, until

#: The backend's speed while the flood arrives (a step then takes about a tenth of a second).
HOLD_SPEED = 0.1


async def flood(
    sim: SimServer, replicas: Sequence[FairqServer], calls: Sequence[Coroutine[Any, Any, None]]
) -> int:
    """Run ``calls`` against ``replicas`` with ``sim`` held slow until each call is queued.

    Returns:
        How many requests reached the backend before it sped up: their turns came in
        arrival order, so the caller leaves the first that many out.

    """
    tasks: list[asyncio.Future[None]] = []

    def started() -> int:  # in the backend or done (a call that failed is done as well)
        return sim.engine.num_running + sim.engine.num_waiting + sum(t.done() for t in tasks)

    def placed() -> int:
        queued = sum(fairq_metric(r, "fairq_queue_depth", model=sim.config.model, tier="standard")
                     for r in replicas)  # fmt: skip
        return int(queued) + started()

    speed, sim.config.speed = sim.config.speed, HOLD_SPEED
    try:
        tasks += [asyncio.ensure_future(c) for c in calls]
        await until(lambda: placed() == len(tasks), what="every request queued")
        held = started()
        sim.config.speed = speed
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        sim.config.speed = speed
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    return held
