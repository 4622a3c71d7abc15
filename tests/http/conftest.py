"""Fixtures: fairq with its HTTP door on in front of the simulator, and an openai client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from fairq_server.api.server import FairqServer
from fairq_server.config import HttpConfig
from fairq_server.sim import SimServer

from ..conftest import KEYS, FairqFactory, freeze_gate, make_config, sim_backend


@dataclass
class Door:
    server: FairqServer
    sim: SimServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"


async def start_door(
    fairq_factory: FairqFactory, sim: SimServer, *, keys: bool = False, **http: object
) -> Door:
    config = make_config([sim_backend(sim)], keys=list(KEYS.values()) if keys else ())
    config = replace(config, http=HttpConfig(listen="127.0.0.1:0", **http))  # type: ignore[arg-type]
    server = await fairq_factory(config)
    assert server.http_port
    return Door(server, sim)


@pytest.fixture
async def door(sim: SimServer, fairq_factory: FairqFactory) -> AsyncIterator[Door]:
    """fairq in open mode (no keys) with the HTTP door, in front of the vLLM simulator."""
    yield await start_door(fairq_factory, sim)


@pytest.fixture
async def keyed_door(sim: SimServer, fairq_factory: FairqFactory) -> AsyncIterator[Door]:
    """fairq with the test keys configured."""
    yield await start_door(fairq_factory, sim, keys=True)


async def freeze(server: FairqServer, backend_id: str = "sim-a") -> None:
    """:func:`freeze_gate`, made safe against a scrape already on its way.

    With the HTTP door starting after the core, the first scheduled scrape may be in flight
    when the poller is cancelled; its result would refresh the snapshot. Wait for the poller
    to end and the dispatcher to apply what it posted, then age the snapshot again.
    """
    task = server.core._polled[backend_id].task
    freeze_gate(server, backend_id)
    await asyncio.gather(task, return_exceptions=True)
    await server.core.dispatcher.sync()
    state = server.core.backend(backend_id)
    assert state is not None
    state.sampled_at = 0.0
