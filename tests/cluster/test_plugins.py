"""Plugins as the cluster's extension points: a policy or a gate option defined here works in
a cluster with no cluster code of its own.

A fairness policy registered only in this file keeps its users' standing in the service
counters it is given; two replicas sharing Redis then serve skewed ingress as one scheduler
would. A gate registered here with an option is what the shared reservation consults, with
the counts of every replica, not a copy of the threshold rule.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any, cast

import grpc
import pytest
import redis.asyncio as aioredis

from fairq_bench.redis_process import RedisProcess
from fairq_server.config.schema import Config, TierConfig
from fairq_server.scheduling import registry
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.counters import LocalCounters
from fairq_server.scheduling.gate import ThresholdGate
from fairq_server.scheduling.interfaces import Cost, GateOutcome, ServiceCounters
from fairq_sim import SimConfig, SimServer
from tests.conftest import FairqFactory
from tests.reliability.helpers import until_async

from .test_shared_fairness import config as fairness_config
from .test_shared_fairness import first_tokens, heavy_share, shares_alone
from .test_shared_gate import flood, replica_config


class LeastServedFairness:
    """Serve the backlogged user with the fewest requests served (a scan: a test policy).

    Nothing in it is about a cluster: its standing lives in the counters it is given.
    """

    def __init__(self, counters: ServiceCounters | None = None) -> None:
        self._counters = counters if counters is not None else LocalCounters()
        self._active: set[str] = set()

    def _standing(self, user: str) -> float:
        return self._counters.get(user) or 0.0

    def activate(self, user: str, weight: float, *, resume: bool = False) -> None:
        self._active.add(user)
        if resume:
            self._counters.lift(user, 0.0)  # keeps its standing
            return
        # No banking of idle time: up to the least served user backlogged here or elsewhere.
        floors = [self._standing(u) for u in self._active if u != user]
        if (elsewhere := self._counters.floor(user)) is not None:
            floors.append(elsewhere)
        self._counters.lift(user, min(floors, default=0.0))

    def deactivate(self, user: str) -> None:
        self._active.discard(user)

    def select(self) -> str:
        return min(self._active, key=lambda u: (self._standing(u), u))

    def candidates(self, quantum: float, limit: int) -> list[str]:
        return [self.select()]

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        self._counters.add(user, float(cost.requests))


class HeadroomGate(ThresholdGate):
    """The threshold gate, with ``headroom`` more waiting requests allowed per tier."""

    def __init__(self, *, headroom: int = 0) -> None:
        self.headroom = headroom

    def check(
        self, backend: BackendState, tier: TierConfig, now: float, stale_after: float
    ) -> GateOutcome:
        looser = replace(tier, max_backend_waiting=tier.max_backend_waiting + self.headroom)
        return super().check(backend, looser, now, stale_after)


def register(monkeypatch: pytest.MonkeyPatch, table: object, name: str, factory: Any) -> None:
    """The one registry line a new plugin needs (undone after the test)."""
    monkeypatch.setitem(cast(MutableMapping[str, Any], table), name, factory)


async def test_a_policy_defined_outside_the_server_gets_cluster_fairness(
    redis_server: RedisProcess, fairq_factory: FairqFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(monkeypatch, registry.FAIRNESS_POLICIES, "least-served", LeastServedFairness)
    sim_config = SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=2)
    async with SimServer(sim_config) as sim:
        floods = await shares_alone(sim, fairq_factory, "least-served")
        a, b = [
            await fairq_factory(fairness_config(sim, redis_server.url, r, "least-served"))
            for r in "ab"
        ]
        assert isinstance(a.core.dispatcher.policies.fairness(LocalCounters()), LeastServedFairness)
        shared = heavy_share(await first_tokens(a, b))
        # Its standing is what the replicas share: every user's counter is in Redis.
        client = aioredis.from_url(redis_server.url)
        users = {"heavy", "light0", "light1", "light2"}

        async def all_stored() -> bool:
            raw = await client.hgetall("fairq:fair:sim:0:counters")
            return {k.decode() for k, v in raw.items() if float(v) > 0} == users

        try:
            await until_async(all_stored, what="every user's counter in Redis")
        finally:
            await client.aclose()
    # One scheduler would give the heavy user 1/4 of the turns; two alone give it about 1/2
    # in one flood of three at least (two replicas alone race for each slot: floods of 0.50,
    # 0.21 and 0.25 in one loaded full run).
    assert max(floods) >= 0.4, (floods, shared)
    assert shared <= 0.375, (floods, shared)


THRESHOLD = 1
HEADROOM = 2


def headroom_config(sim: SimServer, redis_url: str, replica: str) -> Config:
    config = replica_config(sim, redis_url, replica)
    tiers = (TierConfig("standard", max_backend_waiting=THRESHOLD, tpot_limit_seconds=None),)
    scheduler = replace(config.scheduler, gate="headroom", gate_options={"headroom": HEADROOM})
    return replace(config, tiers=tiers, scheduler=scheduler)


async def test_the_shared_reservation_applies_the_configured_gate_and_its_options(
    redis_server: RedisProcess, fairq_factory: FairqFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tier's threshold is 1; the configured gate allows 2 more. Reserving against the
    threshold (the rule copied into Redis) would hold the backend queue at 1; the gate's own
    rule, on every replica's counts, lets it reach 3 and no further."""
    register(monkeypatch, registry.GATES, "headroom", HeadroomGate)
    # One slot, so what fairq holds on the backend beyond it waits in the engine's queue,
    # where the engine's own peak sees it (four fast slots left that queue empty).
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=1.0, max_num_seqs=1)) as sim:
        shared = [await fairq_factory(headroom_config(sim, redis_server.url, r)) for r in "ab"]
        peak, outcomes = await flood(shared, sim, 12)
    assert all(o.code is grpc.StatusCode.OK for o in outcomes), outcomes
    assert THRESHOLD < peak <= THRESHOLD + HEADROOM, peak
    reservations = [s.core.cluster.metrics.reservations for s in shared if s.core.cluster]
    granted = sum(m.labels("sim-a", "granted")._value.get() for m in reservations)  # type: ignore[attr-defined]
    assert granted == 24, granted
