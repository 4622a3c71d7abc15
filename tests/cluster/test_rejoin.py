"""A replica coming back to Redis: counted there at once, on the shared gate one beat later.

Between the first heartbeat that reaches Redis again and the second, a replica still uses its
local share of the backend, but reserves every request through Redis: another replica may be
back on the shared gate already, and reads the counts there as the whole cluster's.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import grpc

from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_sim import SimServer
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import gen_request, generate, run_call, until


def _reservations(metric: object, outcome: str) -> float:
    return metric.labels("sim-a", outcome)._value.get()  # type: ignore[attr-defined, no-any-return]


async def _replica(
    fairq_factory: FairqFactory, sim: SimServer, redis: RedisProcess, lease_seconds: float
) -> FairqServer:
    """One replica on the shared gate, half the backend for its local share."""
    cluster = ClusterConfig(redis.url, replica_id="r", local_share=0.5, lease_seconds=lease_seconds)
    fairq = await fairq_factory(replace(make_config([sim_backend(sim)]), cluster=cluster))
    assert fairq.core.cluster is not None and fairq.core.cluster.connected
    return fairq


async def test_a_rejoining_replica_reserves_through_redis_on_its_local_share(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    with RedisProcess.running() as redis:
        # A long lease: the heartbeats of this test are the ones it calls itself.
        fairq = await _replica(fairq_factory, sim, redis, lease_seconds=60.0)
        node = fairq.core.cluster
        state = fairq.core.backend("sim-a")
        assert node is not None and state is not None
        reservations = node.metrics.reservations
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fairq.port}") as channel:
            redis.stop()
            # The refresher's subscription notices the loss at once.
            await until(lambda: state.share == 0.5, what="the backend on the local share")
            assert not node.connected and not node.reserving
            outcome = await run_call(generate(channel, gen_request()))
            assert outcome.code is grpc.StatusCode.OK, outcome
            assert _reservations(reservations, "local") == 1

            redis.start()  # empty
            await node.heartbeat()
            assert node.reserving and not node.connected
            granted = _reservations(reservations, "granted")
            outcome = await run_call(generate(channel, gen_request()))
            assert outcome.code is grpc.StatusCode.OK, outcome
            assert _reservations(reservations, "granted") == granted + 1  # counted in Redis
            assert _reservations(reservations, "local") == 1  # no more than before
            assert state.share == 0.5  # the release's counts did not end the local share

            await node.heartbeat()
            assert node.connected
            await until(lambda: state.share == 1.0, what="the backend on the shared gate")


async def test_a_reservation_redis_does_not_answer_is_admitted_again_on_the_local_share(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Not forwarded as it was: it had been admitted against the shared view of the backend."""
    with RedisProcess.running() as redis:
        # Redis calls time out after a third of the lease, a second.
        fairq = await _replica(fairq_factory, sim, redis, lease_seconds=3.0)
        node = fairq.core.cluster
        assert node is not None
        reservations = node.metrics.reservations
        assert redis.proc is not None
        # Stopped, not closed: the connections stay up, so nothing notices before the
        # reservation times out.
        os.kill(redis.proc.pid, signal.SIGSTOP)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{fairq.port}") as channel:
                outcome = await run_call(generate(channel, gen_request()))
        finally:
            os.kill(redis.proc.pid, signal.SIGCONT)
        assert outcome.code is grpc.StatusCode.OK, outcome
        assert _reservations(reservations, "unreachable") == 1
        assert _reservations(reservations, "local") == 1  # the same request, admitted again
        assert _reservations(reservations, "granted") == 0
