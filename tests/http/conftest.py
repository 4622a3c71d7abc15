"""Fixtures: fairq with its HTTP door on in front of the simulator, and an openai client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from fairq_server.app import FairqServer
from fairq_server.config.schema import HttpConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, make_config, sim_backend


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
