"""A stored key's team must be a team in force while any is (as a file key's and a quota's):
refused at creation over the Admin RPC, by ``fairq keys create`` and by the console's form."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_server.config.schema import ConsoleConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.tools import stored_keys
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from ..http.console.conftest import session_csrf
from .helpers import store_config

ROOT = (("authorization", "Bearer root-key"),)


async def test_a_stored_key_names_a_configured_team_or_none(
    sim: SimServer,
    fairq_factory: FairqFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = store_config(
        f"sqlite:///{tmp_path / 'fairq.db'}", [sim_backend(sim)], keys=tuple(KEYS.values())
    )
    config = replace(
        config,
        teams=(TeamConfig("research", 2.0), TeamConfig("ops")),
        console=ConsoleConfig(enabled=True),
    )
    server = await fairq_factory(config)
    assert server.store is not None and server.managed is not None
    target = f"127.0.0.1:{server.port}"
    async with grpc.aio.insecure_channel(target) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        # The RPC: a typo is refused, naming it and the teams configured.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.CreateKey(
                admin_pb2.CreateKeyRequest(user="ada", team="reserch"), metadata=ROOT
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == (
            "team: team 'reserch' is not configured in [[teams]] (configured: 'ops', 'research')"
        )
        made = await admin.CreateKey(
            admin_pb2.CreateKeyRequest(user="ada", team="research"), metadata=ROOT
        )
        assert made.key.team == "research"
        await admin.CreateKey(admin_pb2.CreateKeyRequest(user="bob"), metadata=ROOT)  # no team
        # A team set live (over the Admin API or the console) is a team in force too.
        await server.managed.set_team("root", "test", "infra", 1.0)
        infra = await admin.CreateKey(
            admin_pb2.CreateKeyRequest(user="cy", team="infra"), metadata=ROOT
        )
        assert infra.key.team == "infra"
    # The CLI (a blocking gRPC client: off the loop serving it).
    argv = ["create", "--user", "dee", "--team", "reserch", "--target", target,
            "--api-key", "root-key"]  # fmt: skip
    assert await asyncio.to_thread(stored_keys.main, argv) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "team 'reserch' is not configured in [[teams]]" in err
    # The console's form.
    url = f"http://127.0.0.1:{server.http_port}"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        csrf = await session_csrf(http, url, "keys")
        form = {"user": "eve", "team": "reserch", "csrf": csrf}
        async with http.post(f"{url}/console/keys", data=form, headers={"Origin": url}) as resp:
            assert resp.status == 200
            page = await resp.text()
        assert "team &#x27;reserch&#x27; is not configured in [[teams]]" in page
        assert "shown this once" not in page
    assert sorted(k.user for k in await server.store.keys.list()) == ["ada", "bob", "cy"]
