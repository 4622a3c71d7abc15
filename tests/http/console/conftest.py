"""Fixtures: fairq with the HTTP door and the console on, in front of the simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.config.schema import ConsoleConfig, HttpConfig
from fairq_sim import SimServer

from ...conftest import KEYS, FairqFactory, make_config, sim_backend
from ..conftest import Door


async def start_console(
    fairq_factory: FairqFactory,
    sim: SimServer,
    *,
    keys: bool = True,
    http: dict[str, object] | None = None,
    **console: object,
) -> Door:
    """fairq with the console (and the test keys unless ``keys`` is False: open mode)."""
    config = make_config([sim_backend(sim)], keys=list(KEYS.values()) if keys else ())
    config = replace(
        config,
        http=HttpConfig(listen="127.0.0.1:0", **(http or {})),  # type: ignore[arg-type]
        console=ConsoleConfig(enabled=True, **{"refresh_seconds": 0.2, **console}),  # type: ignore[arg-type]
    )
    return Door(await fairq_factory(config), sim)


@pytest.fixture
async def console(sim: SimServer, fairq_factory: FairqFactory) -> AsyncIterator[Door]:
    """fairq with the test keys (root-key is the admin) and the console refreshing every 0.2 s."""
    yield await start_console(fairq_factory, sim)


def generate(
    model: str = "sim", tier: str = "batch", max_tokens: int = 8
) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(
        model=model, prompt="hi", tier=tier,
        sampling=scheduler_pb2.SamplingParams(max_tokens=max_tokens),
    )  # fmt: skip


def stub(channel: grpc.aio.Channel) -> scheduler_pb2_grpc.SchedulerStub:
    return scheduler_pb2_grpc.SchedulerStub(channel)


async def session_csrf(http: aiohttp.ClientSession, url: str, page: str) -> str:
    """Log ``http`` in to the console at ``url`` as root; return the CSRF token of ``page``."""
    login = await http.post(
        f"{url}/console/login", data={"key": "root-key"}, headers={"Origin": url},
        allow_redirects=False,
    )  # fmt: skip
    assert login.status == 303
    async with http.get(f"{url}/console/{page}") as response:
        return (await response.text()).split('name="csrf" value="')[1].split('"')[0]
