"""Preemption by continuation through a real fairq and a simulated backend (vLLM, TGI modes).

Two power requests hold both running slots of the backend; a light user's request arrives.
With preemption the light request starts at once (it finishes while the power requests still
run) and the preempted caller reads one unbroken stream: one start, its text, one finish with
the full usage and finish reason. Without preemption it waits for a slot to free.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.preempt import PreemptConfig
from fairq_server.config.schema import DEFAULT_TIERS
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, make_config, sim_backend

POWER_TOKENS = 300
SLOTS = 2


async def until(predicate: Callable[[], bool], timeout: float) -> None:
    """Wait for dispatcher state that no event announces, with a deadline."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling the dispatcher's state
            await asyncio.sleep(0.005)


@pytest.fixture(params=["vllm", "tgi"])
async def slow_sim(request: pytest.FixtureRequest) -> AsyncIterator[SimServer]:
    config = SimConfig(mode=request.param, model="sim", speed=2.0, max_num_seqs=SLOTS)
    async with SimServer(config) as s:
        yield s


async def start_fairq(factory: FairqFactory, sim: SimServer, *, preempt: bool) -> FairqServer:
    tiers = tuple(
        replace(t, preempt_after_seconds=0.0 if preempt else None, max_backend_waiting=0)
        for t in DEFAULT_TIERS
    )
    backend = sim_backend(sim, preempt=preempt, max_in_flight=SLOTS)
    config = make_config([backend], preempt=PreemptConfig(min_tokens=4, max_per_second=100))
    return await factory(replace(config, tiers=tiers))


def gen(prompt: str, max_tokens: int, seed: int | None = None) -> scheduler_pb2.GenerateRequest:
    sampling = scheduler_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=seed)
    return scheduler_pb2.GenerateRequest(model="sim", prompt=prompt, sampling=sampling)


async def read_all(
    stub: scheduler_pb2_grpc.SchedulerStub, req: scheduler_pb2.GenerateRequest, user: str,
    log: list[str],
) -> list[scheduler_pb2.GenerateResponse]:  # fmt: skip
    events = []
    async for event in stub.Generate(req, metadata=(("x-fairq-user", user),)):
        events.append(event)
        if event.WhichOneof("event") == "finished":
            log.append(f"{user}:{req.prompt}")
    return events


async def power_then_light(
    server: FairqServer, seed: int | None = None
) -> tuple[list[str], list[list[object]]]:
    """Fill both slots with power requests, then send a light one; return finish order."""
    state = server.core.backend("sim-a")
    assert state is not None
    done: list[str] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        stub = scheduler_pb2_grpc.SchedulerStub(ch)
        power = [
            asyncio.create_task(
                read_all(stub, gen(f"power {i}", POWER_TOKENS, seed), "power", done)
            )
            for i in range(SLOTS)
        ]
        running = server.core.dispatcher.attempts.on_backend
        await until(
            lambda: state.in_flight == SLOTS and all(t.generating for t in running["sim-a"]), 30
        )
        light = await read_all(stub, gen("light", 4), "light", done)
        results = [light, *await asyncio.gather(*power)]
    return done, results  # type: ignore[return-value]


def kinds(events: list[scheduler_pb2.GenerateResponse]) -> list[str]:
    return [e.WhichOneof("event") for e in events]


async def test_a_light_request_preempts_and_the_victim_streams_on(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await start_fairq(fairq_factory, slow_sim, preempt=True)
    done, (light, *power) = await power_then_light(server)
    # The light request finished while both power requests were still generating.
    assert done[0] == "light:light", done
    telemetry = server.core.telemetry
    preempted = telemetry.preemptions.labels("sim-a", "fair-share")._value.get()
    assert preempted == 1
    # The output so far is read again as prompt (prefill); no token is decoded twice.
    assert telemetry.preempt_resumed.labels("sim-a")._value.get() >= 4
    assert telemetry.preempt_regenerated.labels("sim-a")._value.get() == 0
    for events in power:
        names = kinds(events)
        # One start, one finish, nothing after it: the caller never saw the preemption.
        assert names[:2] == ["queued", "started"]
        assert names.count("started") == 1 and names.count("finished") == 1
        assert names[-1] == "finished" and set(names[2:-1]) == {"chunk"}
        finished = events[-1].finished
        assert finished.usage.completion_tokens == POWER_TOKENS
        assert finished.finish_reason == "length"
        # The prompt, not prompt + output: a text continuation's prompt counts the output as
        # the engine tokenizes it again, which may differ by a few tokens at most.
        assert finished.usage.prompt_tokens < 30
    assert kinds(light)[-1] == "finished"


async def test_without_preemption_the_light_request_waits_for_a_slot(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await start_fairq(fairq_factory, slow_sim, preempt=False)
    done, _ = await power_then_light(server)
    assert done[0].startswith("power:"), done
    assert server.core.telemetry.preemptions.labels("sim-a", "fair-share")._value.get() == 0


async def test_a_request_with_a_seed_is_never_preempted(
    slow_sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await start_fairq(fairq_factory, slow_sim, preempt=True)
    done, _ = await power_then_light(server, seed=7)
    assert done[0].startswith("power:"), done
    assert server.core.telemetry.preemptions.labels("sim-a", "fair-share")._value.get() == 0


async def test_the_slot_goes_back_to_the_victim_when_the_light_request_ends(
    fairq_factory: FairqFactory,
) -> None:
    # Power requests hold both slots; another user's short request waits in the same tier; a
    # light request of a preempting tier takes a power request's slot. When it ends, that slot
    # goes back to the preempted request (the power requests finish first, the other user's
    # request waits for one of them), not to the next fair pick (the other user, whose
    # counter is lowest, would run at once and finish first). A continuation left to its
    # user's turn ran in the flood's tail on real vLLM (docs/design/preemption.md).
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=2.0, max_num_seqs=SLOTS)) as sim:
        tiers = (
            replace(DEFAULT_TIERS[0], preempt_after_seconds=0.0, max_backend_waiting=0),
            *(replace(t, max_backend_waiting=0) for t in DEFAULT_TIERS[1:]),
        )
        backend = sim_backend(sim, preempt=True, max_in_flight=SLOTS)
        config = make_config([backend], preempt=PreemptConfig(min_tokens=4, max_per_second=100))
        server = await fairq_factory(replace(config, tiers=tiers))
        standard = DEFAULT_TIERS[1].name
        state = server.core.backend("sim-a")
        assert state is not None
        done: list[str] = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)

            def send(user: str, prompt: str, tokens: int, tier: str) -> asyncio.Task[object]:
                req = gen(prompt, tokens)
                req.tier = tier
                return asyncio.create_task(read_all(stub, req, user, done))

            power = [send("power", f"power {i}", POWER_TOKENS, standard) for i in range(SLOTS)]
            running = server.core.dispatcher.attempts.on_backend
            await until(
                lambda: state.in_flight == SLOTS and all(t.generating for t in running["sim-a"]),
                30,
            )
            other = send("other", "other", 8, standard)
            models = server.core.dispatcher._models
            await until(lambda: (m := models.get("sim")) is not None and len(m.queue) == 1, 5)
            light = send("light", "light", 4, DEFAULT_TIERS[0].name)
            await asyncio.gather(light, other, *power)
        assert server.core.telemetry.preemptions.labels("sim-a", "tier")._value.get() == 1
        assert server.core.telemetry.preempt_repaid.labels("sim-a")._value.get() == 1
        assert done[0] == "light:light", done
        assert done.index("other:other") > done.index("power:power 0") or done.index(
            "other:other"
        ) > done.index("power:power 1"), done


async def test_a_user_already_running_waits_for_a_slot_about_to_free(
    fairq_factory: FairqFactory,
) -> None:
    # Four slots: "power" holds three (two long requests and one within min_tokens of its
    # end from its first token), "other" holds one and sends a second. By standing "other"
    # may preempt a long power request, but a slot frees within min_tokens steps anyway: it
    # waits for that slot (no preemption, no prefill redone). A user with nothing running
    # still preempts at once while that short request runs.
    # A slow engine (speed 0.25, ~6 ms a token): the short request runs ~0.4 s, long enough
    # for fairq to react on a loaded machine before its slot frees.
    slots, short = 4, 60
    async with SimServer(
        SimConfig(mode="vllm", model="sim", speed=0.25, max_num_seqs=slots)
    ) as sim:
        tiers = tuple(
            replace(t, preempt_after_seconds=0.0, max_backend_waiting=0) for t in DEFAULT_TIERS
        )
        backend = sim_backend(sim, preempt=True, max_in_flight=slots)
        cfg = PreemptConfig(min_tokens=short, max_per_second=100)
        server = await fairq_factory(replace(make_config([backend], preempt=cfg), tiers=tiers))
        state = server.core.backend("sim-a")
        assert state is not None
        running = server.core.dispatcher.attempts.on_backend
        done: list[str] = []

        def tokens(prompt: str) -> int:
            for ticket in running.get("sim-a", ()):
                if ticket.request.prompt == prompt and ticket.progress is not None:
                    return ticket.progress.tokens
            return -1

        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)

            def send(user: str, prompt: str, n: int) -> asyncio.Task[object]:
                return asyncio.create_task(read_all(stub, gen(prompt, n), user, done))

            tasks = [send("power", "long 0", 450), send("power", "long 1", 450)]
            tasks.append(send("other", "other 0", 450))
            # The long requests become victims once past min_tokens in their attempt.
            await until(lambda: min(tokens(p) for p in ("long 0", "long 1")) >= short, 30)
            tasks.append(send("power", "short", short))
            await until(lambda: tokens("short") >= 1, 10)
            tasks.append(send("other", "other 1", 4))
            models = server.core.dispatcher._models
            await until(lambda: (m := models.get("sim")) is not None and len(m.queue) == 1, 5)
            preemptions = server.core.telemetry.preemptions.labels("sim-a", "fair-share")
            assert preemptions._value.get() == 0
            # Someone with nothing running preempts at once, the short request still running.
            tasks.append(send("light", "light", 4))
            await until(lambda: preemptions._value.get() == 1, 10)
            assert tokens("short") >= 1, "the short request was still running"
            await asyncio.gather(*tasks)
        # "other" waited for the short request's slot: it finished after it, never preempted.
        assert done.index("other:other 1") > done.index("power:short"), done
        assert preemptions._value.get() == 1
