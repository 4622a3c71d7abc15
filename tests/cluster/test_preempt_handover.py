"""A preemption in a cluster hands the victim's slot to the preempting request through Redis.

Two replicas share a simulated backend of two running slots through one real redis-server.
Replica A runs two power requests (both slots); replica B holds a request waiting for a slot;
then a light request on A preempts a power request. The victim's member in the shared gate
is taken over by the light request in one script, never released in between: B's request
cannot take the slot, A's reservation is never refused, and one preemption suffices.

The simulator's engine is held from when both power requests could be preempted until the
light request reaches it: at full speed a power request lasts ~0.2 s, which a loaded machine
spent setting up, and its end freed a slot for B's request before the light one ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.preempt import PreemptConfig
from fairq_server.config.schema import DEFAULT_TIERS
from fairq_sim import SimConfig, SimServer
from tests.cluster.credit_helpers import requests_held
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import until

SLOTS = 2
BACKEND = "sim-a"
MIN_TOKENS = 4  # preemption's min_tokens: a power request younger than this is no victim


async def replica(factory: FairqFactory, sim: SimServer, redis_url: str, name: str) -> FairqServer:
    tiers = tuple(
        replace(t, preempt_after_seconds=0.0, max_backend_waiting=0, tpot_limit_seconds=None)
        for t in DEFAULT_TIERS
    )
    backend = sim_backend(sim, preempt=True, max_in_flight=SLOTS)
    config = make_config(
        [backend], preempt=PreemptConfig(min_tokens=MIN_TOKENS, max_per_second=100)
    )
    cluster = ClusterConfig(redis_url, replica_id=name, lease_seconds=2.0, refresh_seconds=0.05)
    return await factory(replace(config, tiers=tiers, cluster=cluster))


def gen(prompt: str, max_tokens: int) -> scheduler_pb2.GenerateRequest:
    sampling = scheduler_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return scheduler_pb2.GenerateRequest(model="sim", prompt=prompt, sampling=sampling)


async def stream(
    stub: scheduler_pb2_grpc.SchedulerStub, req: scheduler_pb2.GenerateRequest, user: str,
    log: list[tuple[str, float]], on_text: Callable[[], None] = lambda: None,
) -> str:  # fmt: skip
    """Read one request; log when it started and finished; return its finish reason."""
    reason = ""
    async for event in stub.Generate(req, metadata=(("x-fairq-user", user),)):
        kind = event.WhichOneof("event")
        if kind in ("started", "finished"):
            log.append((f"{user} {kind}", time.monotonic()))
        if kind == "chunk" and on_text is not None:
            on_text()
            on_text = None  # type: ignore[assignment]
        if kind == "finished":
            reason = event.finished.finish_reason
    return reason


def outcome(server: FairqServer, name: str) -> float:
    node = server.core.cluster
    assert node is not None
    value: float = node.metrics.reservations.labels(BACKEND, name)._value.get()
    return value


async def test_the_preempting_request_takes_the_victims_slot_in_redis(
    redis_server: RedisProcess, fairq_factory: FairqFactory
) -> None:
    # Crawling (~0.1 s a token) until held, so that no power request ends meanwhile.
    config = SimConfig(mode="vllm", model="sim", speed=0.01, max_num_seqs=SLOTS)
    async with SimServer(config) as sim:
        a = await replica(fairq_factory, sim, redis_server.url, "a")
        b = await replica(fairq_factory, sim, redis_server.url, "b")
        log: list[tuple[str, float]] = []
        state_a, state_b = a.core.backend(BACKEND), b.core.backend(BACKEND)
        assert state_a is not None and state_b is not None
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{a.port}") as ch_a,
            grpc.aio.insecure_channel(f"127.0.0.1:{b.port}") as ch_b,
        ):
            stub_a, stub_b = (
                scheduler_pb2_grpc.SchedulerStub(ch_a),
                scheduler_pb2_grpc.SchedulerStub(ch_b),
            )
            power = [
                asyncio.create_task(stream(stub_a, gen(f"power {i}", 300), "power", log))
                for i in range(SLOTS)
            ]
            running = a.core.dispatcher.attempts.on_backend
            await until(
                lambda: (
                    state_a.in_flight == SLOTS
                    and all(
                        t.generating and t.progress is not None and t.progress.tokens >= MIN_TOKENS
                        for t in running.get(BACKEND, ())
                    )
                ),
                what="both slots generating on replica a, past preemption's min_tokens",
            )
            # No more tokens until the light request is on the engine: no power request can
            # end and free a slot first, however slow the machine.
            sim.state.runner.hold()
            sim.config.speed = 2.0
            await until(lambda: state_b.peer_in_flight == SLOTS, what="b sees the slots taken")
            waiting = asyncio.create_task(stream(stub_b, gen("other", 4), "other", log))
            models_b = b.core.dispatcher._models
            await until(
                lambda: "sim" in models_b and len(models_b["sim"].queue) == 1,
                what="b's request queued",
            )
            # A's refused reservations before the light request, and when its text came.
            refused = [outcome(a, "refused")]
            light_call = asyncio.create_task(
                stream(
                    stub_a, gen("light", 4), "light", log,
                    lambda: refused.append(outcome(a, "refused")),
                )
            )  # fmt: skip
            # The victim aborted, the light request waits on the held engine: released, it
            # runs its 4 tokens in the batch of a power request with ~290 left.
            await until(lambda: sim.engine.num_waiting == 1, what="the light request on the engine")
            sim.state.runner.release()
            light = await light_call
            results = await asyncio.gather(waiting, *power)
    assert light == "length" and all(r == "length" for r in results), (light, results)
    at = dict(log)
    # The slot went from the victim to the light request without ever being free: B's
    # request started only once a request ended (the light one first).
    assert at["other started"] > at["light finished"], sorted(log, key=lambda e: e[1])
    assert outcome(a, "handed") == 1
    # The light request was never refused a slot (later the continuation and B's request
    # may race for the slot the light one frees: that is an ordinary release).
    assert refused[1] == refused[0], refused
    preemptions = a.core.telemetry.preemptions.labels(BACKEND, "fair-share")._value.get()
    assert preemptions == 1
    # Every slot was given back: nothing held in Redis once all ended but idle credit.
    for server in (a, b):
        await until(lambda s=server: requests_held(s) == 0, what="slots released")
