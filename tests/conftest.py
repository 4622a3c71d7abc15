"""Shared fixtures: a simulated backend and in-process fairq servers on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace

import pytest

from fairq_server.app import FairqServer
from fairq_server.config.schema import BackendConfig, Config, KeyConfig, SchedulerConfig
from fairq_server.identity.auth import hash_key
from fairq_sim import SimConfig, SimServer

from .stacks import task_stacks

#: The longest a test server's stop may take (a few seconds normally; grace is 0.5 s).
_STOP_SECONDS = 60

KEYS = {
    "alice-key": KeyConfig("alice", hash_key("alice-key"), tiers=("standard", "batch")),
    "bob-key": KeyConfig("bob", hash_key("bob-key"), tiers=("interactive", "standard", "batch")),
    "root-key": KeyConfig("root", hash_key("root-key"), admin=True),
}

FairqFactory = Callable[..., Awaitable[FairqServer]]


def make_config(
    backends: Sequence[BackendConfig] = (),
    *,
    keys: Sequence[KeyConfig] = (),
    **scheduler: object,
) -> Config:
    """A loopback config with fast polling (tests should not wait on the interval)."""
    sched = replace(
        SchedulerConfig(
            poll_interval_seconds=0.05, stale_after_seconds=1.0, max_poll_backoff_seconds=1.0
        ),
        **scheduler,
    )
    return Config(listen="127.0.0.1:0", scheduler=sched, backends=tuple(backends), keys=tuple(keys))


def sim_backend(sim: SimServer, backend_id: str = "sim-a", **kw: object) -> BackendConfig:
    return BackendConfig(
        backend_id,
        sim.config.mode,
        sim.url,
        (sim.config.model,),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    """A vLLM-mode simulated backend serving model 'sim', fast clock."""
    async with SimServer(SimConfig(mode="vllm", model="sim", speed=20.0, max_num_seqs=4)) as s:
        yield s


@pytest.fixture
async def fairq_factory() -> AsyncIterator[FairqFactory]:
    servers: list[FairqServer] = []

    async def make(config: Config) -> FairqServer:
        server = FairqServer(config)
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        # Bounded: a stop that hangs fails the test that made the server, not a later one
        # (a server left running keeps its collector's frozen heap, for one), and says where
        # every task waits while the hang is still there to see.
        stop = asyncio.create_task(server.stop(grace=0.5), name="fairq-stop")
        done, _ = await asyncio.wait({stop}, timeout=_STOP_SECONDS)
        if not done:
            stacks = task_stacks()
            stop.cancel()
            await asyncio.gather(stop, return_exceptions=True)
            pytest.fail(f"stop() did not return in {_STOP_SECONDS} s; where it waits:\n{stacks}")
        stop.result()


async def freeze_gate(server: FairqServer, backend_id: str = "sim-a") -> None:
    """Stop polling ``backend_id`` and age its last snapshot: its gate fails closed.

    The backend stays registered and healthy, so requests are accepted and stay queued. A
    scrape already on its way when the poller is cancelled would refresh the snapshot, so this
    waits for the poller to end and the dispatcher to apply what it posted, then ages the
    snapshot.
    """
    state = server.core.backend(backend_id)
    assert state is not None and state.sample is not None
    task = server.core._polled[backend_id].task
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await server.core.dispatcher.sync()
    state.sampled_at = 0.0
