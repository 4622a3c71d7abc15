"""Configuration reload: in process, and by SIGHUP to a real `fairq serve`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import ConfigError, SchedulerConfig, TierConfig
from fairq_sim import SimConfig, SimServer

from ..conftest import FairqFactory, freeze_gate, make_config, sim_backend

GEN = scheduler_pb2.GenerateRequest(
    model="sim", prompt="hello", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
)


async def test_reload_keeps_queued_requests_and_applies_new_policy_and_backends(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)])
    server = await fairq_factory(config)
    await freeze_gate(server)  # the old backend takes nothing: requests stay queued
    async with (
        SimServer(SimConfig(mode="vllm", model="sim", speed=20.0)) as sim2,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        calls = [
            stub.Generate(GEN, metadata=(("x-fairq-user", user),), timeout=20)
            for user in ("ann", "ann", "bob")
        ]
        for call in calls:
            assert (await call.read()).WhichOneof("event") == "queued"
        new = replace(
            config,
            scheduler=replace(config.scheduler, fairness="vtc", ordering="shortest-first"),
            tiers=tuple(replace(t, max_backend_waiting=5) for t in config.tiers),
            backends=(sim_backend(sim), sim_backend(sim2, "sim-b")),
        )
        await server.reload(new)
        assert server.core.dispatcher.tiers[0].max_backend_waiting == 5
        for call in calls:
            events = []
            while (event := await call.read()) is not grpc.aio.EOF:
                events.append(event)
            assert events[0].started.backend_id == "sim-b"
            assert events[-1].finished.usage.completion_tokens == 4
    assert len(server.core.dispatcher.queue("sim")) == 0


async def test_reload_refuses_tier_changes_and_changes_nothing(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    config = make_config([sim_backend(sim)])
    server = await fairq_factory(config)
    bad = replace(
        config,
        tiers=(TierConfig("gold"),),
        scheduler=SchedulerConfig(fairness="vtc"),
    )
    with pytest.raises(ConfigError, match="tiers cannot be renamed"):
        await server.reload(bad)
    assert server.config.scheduler.fairness == "round-robin"
    assert server.core.config.scheduler.fairness == "round-robin"


async def test_reload_applies_polling_settings_to_running_pollers(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    """Poll interval and failure threshold reach the running pollers and later ones."""
    config = make_config([sim_backend(sim)])
    server = await fairq_factory(config)
    poller = server.core._polled["sim-a"].poller
    assert server.core.dispatcher.config.unhealthy_after_failures == 2
    new = replace(config.scheduler, unhealthy_after_failures=5, poll_interval_seconds=0.37)
    assert poller.interval != new.poll_interval_seconds
    await server.reload(replace(config, scheduler=new))
    await server.core.dispatcher.sync()
    assert server.core.dispatcher.config.unhealthy_after_failures == 5
    assert poller.interval == 0.37
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=20.0)) as sim2:
        await server.reload(
            replace(config, scheduler=new, backends=(sim_backend(sim), sim_backend(sim2, "sim-b")))
        )
        assert server.core.backend("sim-b") is not None
        assert server.core._polled["sim-b"].poller.interval == 0.37


def _toml(backends: list[tuple[str, str]]) -> str:
    text = 'listen = "127.0.0.1:0"\n'
    for backend_id, url in backends:
        text += (
            f'[[backends]]\nid = "{backend_id}"\nkind = "vllm"\nbase_url = "{url}"\n'
            'models = ["sim"]\n'
        )
    return text


async def _list(target: str) -> list[str]:
    async with grpc.aio.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        reply = await admin.ListBackends(admin_pb2.ListBackendsRequest(), timeout=5)
    return sorted(b.backend.id for b in reply.backends)


async def test_sighup_reloads_a_running_server(sim: SimServer, tmp_path: Path) -> None:
    path = tmp_path / "fairq.toml"
    path.write_text(_toml([("a", sim.url)]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairq_server", "serve", "--config", str(path), "--grace", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, process_group=0,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = (await proc.stdout.readline()).decode()
        target = "127.0.0.1:" + line.split("(port ")[1].split(")")[0]
        assert await _list(target) == ["a"]
        path.write_text(_toml([("a", sim.url), ("b", sim.url)]))
        os.kill(proc.pid, signal.SIGHUP)
        async with asyncio.timeout(10):
            # Polling another process's state with a deadline: there is no event to await.
            while await _list(target) != ["a", "b"]:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        path.write_text("tiers = []\n")  # invalid: refused, the running config stays
        os.kill(proc.pid, signal.SIGHUP)
        async with grpc.aio.insecure_channel(target) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            events = [e async for e in stub.Generate(GEN, timeout=10)]
        assert events[-1].WhichOneof("event") == "finished"
        assert await _list(target) == ["a", "b"]
        assert proc.returncode is None
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
