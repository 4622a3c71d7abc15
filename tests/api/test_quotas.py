"""Hard quotas end to end over gRPC: refusals with gRPC's retry pushback, the rolling window,
settlement from the backend's usage, requests per minute, tokens per day, per-model quotas.

The limit book's clock is injected (wall-clock seconds), so windows roll without sleeping.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.cli import _reload
from fairq_server.config.entitlement import QuotaConfig
from fairq_server.config.loader import load_config
from fairq_server.config.schema import Config, KeyConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_server.tenancy.books.book import LimitKey, Measure, Scope, Window
from fairq_server.tenancy.checker import Entitlement
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, freeze_gate, make_config, sim_backend

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC: far from a day's end


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def gen(max_tokens: int = 8, model: str = "sim") -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(
        model=model, prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=max_tokens)
    )


async def start(
    fairq_factory: FairqFactory, config: Config, *quotas: QuotaConfig
) -> tuple[FairqServer, Clock]:
    server = await fairq_factory(replace(config, quotas=quotas))
    clock = Clock()
    entitlement(server).clock = clock
    return server, clock


def entitlement(server: FairqServer) -> Entitlement:
    found = server.core.dispatcher.entitlement
    assert found is not None
    return found


def used(server: FairqServer, measure: Measure, window: Window, user: str = "ann") -> float:
    key = LimitKey(Scope.USER, user, None, measure, window)
    return entitlement(server).book.used_now([key], entitlement(server).clock())[0]


async def call(
    server: FairqServer, request: scheduler_pb2.GenerateRequest, user: str = "ann"
) -> list[scheduler_pb2.GenerateResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return [e async for e in stub.Generate(request, metadata=(("x-fairq-user", user),))]


async def refused(
    server: FairqServer, request: scheduler_pb2.GenerateRequest, user: str = "ann"
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(server, request, user)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return info.value


def pushback_ms(error: grpc.aio.AioRpcError) -> int:
    trailers = dict(error.trailing_metadata() or ())
    return int(trailers["grpc-retry-pushback-ms"])


async def test_hard_tokens_per_minute_refuses_with_the_delay_and_rolls(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)])
    server, clock = await start(
        fairq_factory, config, QuotaConfig(user="ann", tokens_per_minute=10)
    )
    events = await call(server, gen(max_tokens=8))
    usage = events[-1].finished.usage
    # Settled from the backend's usage, not the reservation's estimate.
    assert used(server, Measure.TOKENS, Window.MINUTE) == usage.prompt_tokens + 8
    clock.now += 20
    error = await refused(server, gen())
    assert 39_000 <= pushback_ms(error) <= 40_000  # the first grant leaves the window at +60
    assert "tokens_per_minute of user 'ann'" in (error.details() or "")
    assert "retry in 40 s" in (error.details() or "")
    await call(server, gen(), user="bob")  # another user is not limited
    clock.now += 40
    assert (await call(server, gen()))[-1].WhichOneof("event") == "finished"
    registry = server.core.telemetry.registry
    refusals = {"kind": "tokens_per_minute", "scope": "user"}
    assert registry.get_sample_value("fairq_limit_refusals_total", refusals) == 1.0
    outcome = {"tier": "none", "outcome": "resource_exhausted"}  # refused before a queue
    assert registry.get_sample_value("fairq_requests_total", outcome) == 1.0


async def test_settlement_gives_back_the_unused_max_tokens(fairq_factory: FairqFactory) -> None:
    # Requests end early at an end-of-sequence token: far fewer tokens than max_tokens.
    cfg = SimConfig(mode="vllm", model="sim", speed=20.0, eos_mean_tokens=2.0, seed=3)
    async with SimServer(cfg) as eos_sim:
        config = make_config([sim_backend(eos_sim)])
        server, _ = await start(
            fairq_factory, config, QuotaConfig(user="ann", tokens_per_minute=1000)
        )
        total = 0
        for _ in range(3):  # each reserves 400 + prompt: without settling, the third is refused
            events = await call(server, gen(max_tokens=400))
            usage = events[-1].finished.usage
            assert usage.completion_tokens < 400
            total += usage.prompt_tokens + usage.completion_tokens
        assert used(server, Measure.TOKENS, Window.MINUTE) == total


async def test_a_hard_limit_reached_while_queued_refuses_at_dispatch(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    backend = sim_backend(sim)
    server, _ = await start(
        fairq_factory, make_config([backend]), QuotaConfig(user="ann", tokens_per_minute=5)
    )
    await freeze_gate(server)  # both are admitted (nothing used yet) and wait
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        md = (("x-fairq-user", "ann"),)
        calls = []
        for _ in range(2):  # one after the other: the first queued is the first dispatched
            calls.append(stub.Generate(gen(max_tokens=8), metadata=md, timeout=20))
            assert (await calls[-1].read()).WhichOneof("event") == "queued"
        await server.core.register_backend(backend)  # the gate opens
        outcomes = []
        for c in calls:
            try:
                while (event := await c.read()) is not grpc.aio.EOF:
                    last = event.WhichOneof("event")
                outcomes.append(last)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert pushback_ms(exc) >= 1
                outcomes.append("refused")
    assert outcomes == ["finished", "refused"]  # the first went within the limit, 13 > 5


async def test_requests_per_minute_and_tokens_per_day(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)])
    quota = QuotaConfig(user="ann", requests_per_minute=2, tokens_per_day=60)
    server, clock = await start(fairq_factory, config, quota)
    await call(server, gen())
    await call(server, gen())
    error = await refused(server, gen())
    assert "requests_per_minute" in (error.details() or "")
    clock.now += 61
    await call(server, gen())
    await call(server, gen())
    assert used(server, Measure.TOKENS, Window.DAY) >= 40
    clock.now += 61
    while used(server, Measure.TOKENS, Window.DAY) < 60:
        await call(server, gen())
        clock.now += 61  # keep the requests per minute out of the way
    error = await refused(server, gen())
    assert "tokens_per_day" in (error.details() or "")
    # Retry at midnight UTC.
    midnight = (clock.now // 86400 + 1) * 86400
    assert abs(pushback_ms(error) - (midnight - clock.now) * 1000) <= 1000
    clock.now = midnight
    assert (await call(server, gen()))[-1].WhichOneof("event") == "finished"


async def test_a_quota_for_one_model_leaves_the_others_alone(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    async with SimServer(SimConfig(mode="vllm", model="other", speed=20.0)) as other:
        config = make_config([sim_backend(sim), sim_backend(other, "other-a")])
        quota = QuotaConfig(user="ann", model="sim", requests_per_minute=1)
        server, _ = await start(fairq_factory, config, quota)
        await call(server, gen())
        await refused(server, gen())
        for _ in range(3):
            events = await call(server, gen(model="other"))
            assert events[-1].WhichOneof("event") == "finished"


async def test_unicode_long_and_key_shaped_names_are_limited_apart(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    names = ["änn ☃", "sk-" + "x" * 48, "n" * 200, "änn"]
    keys = [KeyConfig(name, hash_key(f"key-{i}")) for i, name in enumerate(names)]
    quotas = [QuotaConfig(user=name, requests_per_minute=1) for name in names[:3]]
    server, _ = await start(fairq_factory, make_config([sim_backend(sim)], keys=keys), *quotas)

    async def as_key(i: int) -> list[scheduler_pb2.GenerateResponse]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            md = (("authorization", f"Bearer key-{i}"),)
            return [e async for e in stub.Generate(gen(), metadata=md)]

    for i in range(3):
        await as_key(i)
    for i, name in enumerate(names[:3]):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await as_key(i)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert repr(name) in (info.value.details() or "")
    for _ in range(2):  # a near name is another user, with no quota
        assert (await as_key(3))[-1].WhichOneof("event") == "finished"


async def test_a_reload_applies_new_limits_and_a_bad_file_is_refused_whole(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    head = f"""
listen = "127.0.0.1:0"
[[backends]]
id = "sim-a"
kind = "vllm"
base_url = "{sim.url}"
models = ["sim"]
"""
    path = tmp_path / "fairq.toml"
    path.write_text(head + "[[quotas]]\nuser = 'ann'\nrequests_per_minute = 1\n")
    server = await fairq_factory(load_config(path))
    entitlement(server).clock = Clock()
    await call(server, gen())
    await refused(server, gen())
    path.write_text(head + "[[quotas]]\nuser = 'ann'\nrequests_per_minute = 3\n")
    await _reload(server, str(path), access_log=False)
    await call(server, gen())  # the counters are kept: 2 of 3 now
    await call(server, gen())
    await refused(server, gen())
    # A zero quota, beside a change that would be valid alone: nothing of it applies.
    path.write_text(
        head + "[[quotas]]\nuser = 'ann'\nrequests_per_minute = 9\n"
        "[[quotas]]\nuser = 'bob'\ntokens_per_minute = 0\n"
    )
    with caplog.at_level(logging.ERROR):
        await _reload(server, str(path), access_log=False)
    assert "quotas[1].tokens_per_minute must be above 0" in caplog.text
    assert "configuration unchanged" in caplog.text
    await refused(server, gen())  # still 3 per minute
    assert server.config.quotas[0].requests_per_minute == 3


async def test_per_team_gauges_show_the_use_of_each_limit(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    keys = [KeyConfig("ann", hash_key("ann-key"), team="research")]
    config = replace(
        make_config([sim_backend(sim)], keys=keys),
        teams=(TeamConfig("research"),),
    )
    quota = QuotaConfig(team="research", tokens_per_minute=100)
    server, clock = await start(fairq_factory, config, quota)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        md = (("authorization", "Bearer ann-key"),)
        events = [e async for e in stub.Generate(gen(max_tokens=8), metadata=md)]
    usage = events[-1].finished.usage
    clock.now += 2  # the gauges are refreshed at most once a second, from the dispatch loop
    entitlement(server).tick()
    registry = server.core.telemetry.registry
    labels = {"team": "research", "kind": "tokens_per_minute", "model": "", "mode": "hard"}
    spent = usage.prompt_tokens + usage.completion_tokens
    assert registry.get_sample_value("fairq_team_limit_used", labels) == spent
    assert registry.get_sample_value("fairq_team_limit", labels) == 100
    assert registry.get_sample_value("fairq_team_limit_used_ratio", labels) == spent / 100
    clock.now += 61
    entitlement(server).tick()
    assert registry.get_sample_value("fairq_team_limit_used_ratio", labels) == 0.0
