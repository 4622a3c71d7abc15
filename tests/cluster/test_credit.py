"""A replica's credit of shared-gate slots, against a real redis-server.

A request spending credit leaves with no Redis round trip; the credits of every replica
never let the backend queue pass the threshold; idle credit goes back when another replica
needs the slot; a killed replica's credit leaves Redis with its lease.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest

from fairq_bench.cluster.faults import live_slots
from fairq_bench.cluster.setup import replica_config as replica_text
from fairq_bench.processes import fairq_module_process
from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.schema import Config, TierConfig
from fairq_sim import SimConfig, SimServer
from tests.cluster.credit_helpers import credit_of
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import Outcome, gen_request, generate, run_call, until

BACKEND = "sim-a"


def config(
    sim: SimServer, redis_url: str, replica: str, threshold: int, **cluster: float
) -> Config:
    tiers = (TierConfig("standard", max_backend_waiting=threshold, tpot_limit_seconds=None),)
    defaults: dict[str, float] = {"lease_seconds": 3.0, "refresh_seconds": 0.05}
    settings = ClusterConfig(redis_url, replica_id=replica, **(defaults | cluster))  # type: ignore[arg-type]
    return replace(make_config([sim_backend(sim)]), tiers=tiers, cluster=settings)


def metric(server: FairqServer, name: str, label: str) -> float:
    node = server.core.cluster
    assert node is not None
    counter = node.metrics.credit if name == "credit" else node.metrics.reservations
    value: float = counter.labels(BACKEND, label)._value.get()
    return value


async def send(server: FairqServer, prompt: str, tokens: int) -> Outcome:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = generate(channel, gen_request(prompt, max_tokens=tokens))
        return await run_call(call)


async def one_request(server: FairqServer, prompt: str = "warm") -> None:
    outcome = await send(server, prompt, 4)
    assert outcome.code is grpc.StatusCode.OK, outcome


async def test_a_request_on_credit_reaches_its_backend_while_redis_answers_nothing(
    sim: SimServer, redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    """No round trip before dispatch: with Redis stopped (SIGSTOP) the request still streams.

    A reservation would wait for Redis until its timeout (a third of the lease) and then
    count a Redis error; the request on credit has its first token before either.
    """
    server = await fairq_factory(config(sim, redis_server.url, "a", threshold=3))
    node = server.core.cluster
    assert node is not None
    await one_request(server)  # reserved through Redis; the credit is claimed behind it
    await until(lambda: credit_of(server).idle(BACKEND) == 1, what="an idle credit slot")
    errors = node.metrics.redis_errors._value.get()
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = generate(channel, gen_request("on credit", max_tokens=4))
            async for response in call:
                if response.WhichOneof("event") == "chunk":
                    # The first token, Redis still stopped: nothing waited for it.
                    assert node.connected
                    assert node.metrics.redis_errors._value.get() == errors
                    break
            else:
                raise AssertionError("the request produced no text")
            call.cancel()
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert metric(server, "reservations", "credit") == 1
    assert metric(server, "reservations", "granted") == 1  # only the first request's


@pytest.fixture
async def slow_sim() -> AsyncIterator[SimServer]:
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=2)) as s:
        yield s


async def test_credits_of_every_replica_never_let_the_queue_pass_the_threshold(
    slow_sim: SimServer, redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    """Three replicas of two credit slots each, threshold 3: six idle slots would be twice it.

    Credit is claimed only while the gate admits one more request beyond it, so all idle
    credit together stays below the threshold; a burst spending it, then everyone's flood,
    keeps the backend queue at it.
    """
    threshold = 3
    servers = [
        await fairq_factory(config(slow_sim, redis_server.url, f"r{i}", threshold, credit_slots=2))
        for i in range(3)
    ]
    credits = [credit_of(s) for s in servers]
    # One after the other: each claims behind its request's first token. A claim refused
    # then (the backend's metrics late on a busy machine) is tried again at the replica's
    # next dispatch only, so the warm-up repeats until some credit is held.
    for attempt in range(5):
        for i, server in enumerate(servers):
            await one_request(server, f"warm {attempt}.{i}")
        await until(lambda: slow_sim.engine.num_running == 0, what="backend idle")
        if sum(c.idle(BACKEND) for c in credits) > 0:
            break
    await until(lambda: sum(c.idle(BACKEND) for c in credits) > 0, what="credit claimed")
    assert sum(c.idle(BACKEND) for c in credits) <= threshold - 1
    holder = max(servers, key=lambda s: credit_of(s).idle(BACKEND))
    idle = credit_of(holder).idle(BACKEND)
    slow_sim.engine.peak_waiting = 0
    burst = [asyncio.create_task(send(holder, f"burst {j}", 24)) for j in range(6)]
    # Spent by the burst (or given back, were the backend's metrics late on a busy machine).
    await until(lambda: credit_of(holder).idle(BACKEND) == 0, what="the idle credit used")
    rest = [send(s, f"flood {j}", 24) for s in servers if s is not holder for j in range(6)]
    outcomes = await asyncio.gather(*burst, *rest)
    assert all(o.code is grpc.StatusCode.OK for o in outcomes), outcomes
    assert slow_sim.engine.peak_waiting <= threshold, slow_sim.engine.peak_waiting
    events = {e: metric(holder, "credit", e) for e in ("claimed", "spent", "returned")}
    assert events["spent"] >= 1, (idle, events)  # the burst went on credit


async def test_idle_credit_goes_back_when_another_replica_fills_the_backend(
    redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    """Replica A holds a credit slot and sends nothing; B's flood still gets the whole queue.

    One running slot and long requests: B's requests queue on the backend up to the
    threshold only once A has given its idle slot back (held, it would keep them at 1).
    The engine crawls until they do: at full speed B's four requests could be served before
    a loaded machine let A hear the counts and give back (the queue then never had two).
    """
    threshold = 2
    one_slot = SimConfig(mode="vllm", model="sim", speed=5.0, max_num_seqs=1)
    async with SimServer(one_slot) as sim:
        a = await fairq_factory(config(sim, redis_server.url, "a", threshold))
        b = await fairq_factory(config(sim, redis_server.url, "b", threshold))
        await one_request(a)
        await until(lambda: credit_of(a).idle(BACKEND) == 1, what="A's idle credit slot")
        sim.engine.peak_waiting = 0
        sim.config.speed = 0.05  # B's first request holds the one slot until the queue is full
        flood = [asyncio.create_task(send(b, f"flood {j}", 60)) for j in range(4)]
        await until(lambda: metric(a, "credit", "returned") == 1, 60, "A's slot given back")
        await until(lambda: sim.engine.peak_waiting == threshold, 60, "B's queue to the threshold")
        sim.config.speed = 5.0
        outcomes = await asyncio.gather(*flood)
        assert all(o.code is grpc.StatusCode.OK for o in outcomes), outcomes
        assert sim.engine.peak_waiting == threshold, sim.engine.peak_waiting  # never past it
        assert metric(a, "credit", "returned") == 1


async def test_a_killed_replicas_credit_leaves_redis_with_its_lease(
    sim: SimServer, redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    """SIGKILL a replica holding only idle credit: the others see the slot free a lease later."""
    lease = 1.0
    survivor = await fairq_factory(
        config(sim, redis_server.url, "survivor", 3, lease_seconds=lease)
    )
    state = survivor.core.backend(BACKEND)
    assert state is not None
    text = replica_text(sim.url, "doomed", redis_server.url, lease_seconds=lease)
    async with fairq_module_process(text.replace('id = "sim"', f'id = "{BACKEND}"')) as (
        proc,
        target,
    ):
        async with grpc.aio.insecure_channel(target) as channel:
            outcome = await run_call(generate(channel, gen_request(max_tokens=4)))
        assert outcome.code is grpc.StatusCode.OK, outcome
        await until_slots(redis_server.url, "doomed", 1)  # its idle credit, the request ended
        await until(lambda: state.peer_awaiting == 1, what="the survivor counts it")
        os.killpg(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        await until_slots(redis_server.url, "doomed", 0, timeout=5 * lease)
        freed = time.monotonic() - killed
        await until(lambda: state.peer_awaiting == 0, what="the survivor sees the slot free")
    # Renewed every third of a lease: gone between two thirds of a lease and one after.
    assert freed <= 2 * lease, freed


async def until_slots(url: str, replica: str, n: int, timeout: float = 10.0) -> None:
    """Wait until ``replica`` holds ``n`` live members in the shared gate of ``BACKEND``."""
    async with asyncio.timeout(timeout):
        # Another process's state (Redis's): nothing to await but reading it again.
        while await live_slots(url, replica, BACKEND) != n:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
