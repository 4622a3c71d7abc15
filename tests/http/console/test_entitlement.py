"""The queue view's quotas and budgets, from real requests through the simulator.

ann is over her soft token quota (her next request waits in the idle-only band) and her team
is near its hard request quota; cy's team is over its soft quota; bob's team reached its hard
daily token quota, so bob is refused, and the team's row says until when.
"""

from __future__ import annotations

import json
from dataclasses import replace

import aiohttp
import grpc

from fairq.v1 import scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_server.config.entitlement import QuotaConfig
from fairq_server.config.schema import ConsoleConfig, HttpConfig, KeyConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_server.tenancy.books.book import Window
from fairq_server.tenancy.books.local import period_end
from fairq_sim import SimServer

from ...api.test_quotas import T0, Clock, entitlement, gen
from ...conftest import FairqFactory, freeze_gate, make_config, sim_backend

KEYS = [
    KeyConfig("ann", hash_key("ann-key"), team="research"),
    KeyConfig("bob", hash_key("bob-key"), team="ops"),
    KeyConfig("cy", hash_key("cy-key"), team="labs"),
    KeyConfig("root", hash_key("root-key"), admin=True),
]
QUOTAS = (
    QuotaConfig(user="ann", tokens_per_minute=5, mode="soft"),
    QuotaConfig(team="research", requests_per_minute=5),
    QuotaConfig(team="ops", tokens_per_day=10),
    QuotaConfig(team="labs", tokens_per_minute=5, mode="soft"),
)
ROOT = {"Authorization": "Bearer root-key"}


def md(user: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {user}-key"),)


async def start_limited(sim: SimServer, fairq_factory: FairqFactory) -> FairqServer:
    """fairq with the quotas above, the teams weighted 3 and 1, the console on."""
    config = replace(
        make_config([sim_backend(sim)], keys=KEYS),
        teams=(TeamConfig("research", 3.0), TeamConfig("ops", 1.0), TeamConfig("labs", 2.0)),
        quotas=QUOTAS,
        http=HttpConfig(listen="127.0.0.1:0"),
        console=ConsoleConfig(enabled=True, refresh_seconds=0.2),
    )
    server = await fairq_factory(config)
    entitlement(server).clock = Clock()  # a fixed moment: the day's end is known
    return server


async def use_quotas(
    server: FairqServer, channel: grpc.aio.Channel
) -> list[grpc.aio.UnaryStreamCall]:  # type: ignore[type-arg]
    """Spend the quotas with real requests; return ann's and cy's requests left waiting."""
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    for _ in range(4):  # 4 of research's 5 requests a minute, and ann's 5 tokens exceeded
        async for _event in stub.Generate(gen(max_tokens=8), metadata=md("ann"), timeout=30):
            pass
    async for _event in stub.Generate(gen(max_tokens=16), metadata=md("bob"), timeout=30):
        pass  # past ops's 10 tokens a day
    async for _event in stub.Generate(gen(max_tokens=8), metadata=md("cy"), timeout=30):
        pass  # past labs's 5 tokens a minute
    try:
        async for _event in stub.Generate(gen(), metadata=md("bob"), timeout=30):
            pass
        raise AssertionError("bob's team is at its hard quota: his request must be refused")
    except grpc.aio.AioRpcError as exc:
        assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    await freeze_gate(server)
    waiting = [stub.Generate(gen(), metadata=md(user), timeout=30) for user in ("ann", "cy")]
    for call in waiting:
        assert (await call.read()).WhichOneof("event") == "queued"
    return waiting


async def test_live_view_shows_each_waiting_users_limits_and_every_teams(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await start_limited(sim, fairq_factory)
    url = f"http://127.0.0.1:{server.http_port}"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        waiting = await use_quotas(server, channel)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/console/api/live", headers=ROOT) as resp:
                assert resp.status == 200
                [view] = (await resp.json())["replicas"]
            async with http.get(f"{url}/console/queues", headers=ROOT) as resp:
                assert resp.status == 200
                page = await resp.text()
        for call in waiting:
            call.cancel()

    [model] = view["models"]
    rows = {r["user"]: r for r in model["rows"]}
    ann, cy = rows["ann"], rows["cy"]
    assert (ann["user"], ann["team"], ann["team_weight"]) == ("ann", "research", 3.0)
    # Owed by team weight (3 against 2), each alone in its team.
    assert (ann["entitled"], cy["entitled"]) == (0.6, 0.4)
    limits = {(lim["scope"], lim["kind"]): lim for lim in ann["limits"]}
    assert set(limits) == {("user", "tokens_per_minute"), ("team", "requests_per_minute")}
    own = limits[("user", "tokens_per_minute")]
    assert (own["mode"], own["state"], own["limit"], own["until"]) == ("soft", "over", 5.0, None)
    assert own["used"] >= 4 * 8  # four requests' completions, at least
    team = limits[("team", "requests_per_minute")]
    assert (team["subject"], team["used"], team["limit"]) == ("research", 4.0, 5.0)
    assert (team["mode"], team["state"]) == ("hard", "warn")  # 80 %

    [labs] = cy["limits"]  # a soft team quota: cy waits in the band for his team's use
    assert (labs["scope"], labs["subject"], labs["state"]) == ("team", "labs", "over")
    # Each says why it waits; neither is starved for it (that was shown before).
    assert ann["state"] == cy["state"] == "held: soft-quota band"
    assert ann["status"] == cy["status"] == ""

    teams = {t["team"]: t for t in view["teams"]}
    assert set(teams) == {"labs", "ops", "research"}
    assert (teams["ops"]["weight"], teams["research"]["weight"]) == (1.0, 3.0)
    [ops] = teams["ops"]["limits"]
    assert (ops["kind"], ops["mode"], ops["state"]) == ("tokens_per_day", "hard", "over")
    assert ops["used"] >= 16
    assert ops["until"] == period_end(Window.DAY, T0)  # the UTC day's end
    assert json.loads(json.dumps(view)) == view  # what a replica publishes to Redis

    # The page says it in words, and marks the rows in attributes (not colour alone).
    assert "over quota — idle-only band" in page
    assert "near limit (80 % or more)" in page
    assert "at limit — refused until 2027-01-16 00:00:00 UTC" in page
    assert '<tr data-team="ops" data-state="over">' in page
    assert '<tr data-team="research" data-state="warn">' in page
    assert 'data-scope="user" data-state="over"' in page
    assert '<strong class="badge over" data-team-over="labs">team over quota</strong>' in page
    assert 'data-team-over="research"' not in page  # near its limit, not over
