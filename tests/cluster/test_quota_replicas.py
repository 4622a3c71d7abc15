"""A hard quota through two fairq replicas sharing Redis: one limit, whichever replica serves."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.redis_process import RedisProcess
from fairq_server.app import FairqServer
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.entitlement import QuotaConfig
from fairq_server.config.store import StoreConfig
from fairq_server.tenancy.books.book import LimitKey, LimitUse, Measure, Refusal, Scope, Window
from fairq_sim import SimServer
from tests.conftest import FairqFactory, make_config, sim_backend
from tests.reliability.helpers import gen_request, until

QUOTA = 120
MAX_TOKENS = 8


async def _send(server: FairqServer, n: int) -> tuple[int, list[grpc.aio.AioRpcError]]:
    """Send ``n`` requests of user ann one after the other: tokens used, refusals."""
    tokens, refusals = 0, []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for _ in range(n):
            request = gen_request(max_tokens=MAX_TOKENS)
            try:
                events: list[scheduler_pb2.GenerateResponse] = [
                    e async for e in stub.Generate(request, metadata=(("x-fairq-user", "ann"),))
                ]
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
                refusals.append(error)
                continue
            usage = events[-1].finished.usage
            tokens += usage.prompt_tokens + usage.completion_tokens
    return tokens, refusals


@pytest.mark.parametrize(("shared", "store"), [(True, False), (True, True), (False, False)])
async def test_a_hard_quota_holds_whichever_replica_serves(
    redis_url: str,  # first: fixtures are torn down in reverse, so Redis outlives the replicas
    sim: SimServer,
    fairq_factory: FairqFactory,
    tmp_path: Path,
    shared: bool,
    store: bool,
) -> None:
    quota = QuotaConfig(user="ann", tokens_per_day=QUOTA)
    replicas = []
    for name in ("r0", "r1"):
        config = replace(make_config([sim_backend(sim)]), quotas=(quota,))
        if store:  # the day's amounts kept in the store too: the book is wrapped
            config = replace(config, store=StoreConfig(url=f"sqlite:///{tmp_path / 'f.db'}"))
        if shared:  # the control: the same replicas, each with its own book
            cluster = ClusterConfig(redis_url, replica_id=name, lease_seconds=2.0)
            config = replace(config, cluster=cluster)
        replicas.append(await fairq_factory(config))
    # Both replicas at once, each sending more than the quota's worth.
    results = await asyncio.gather(*(_send(r, 14) for r in replicas))
    served = sum(tokens for tokens, _ in results)
    one_request = served / max(1, sum(14 - len(refused) for _, refused in results))
    if not shared:  # each replica alone lets the whole quota through
        assert served >= 2 * QUOTA - 2 * one_request
        return
    assert QUOTA <= served <= QUOTA + one_request + MAX_TOKENS
    assert all(refused for _, refused in results)  # each replica refuses: the limit is one
    error = results[1][1][-1]
    assert "tokens_per_day of user 'ann'" in (error.details() or "")
    trailers = dict(error.trailing_metadata() or ())
    assert int(trailers["grpc-retry-pushback-ms"]) > 0
    key = LimitKey(Scope.USER, "ann", None, Measure.TOKENS, Window.DAY)
    entitlement = replicas[0].core.dispatcher.entitlement
    assert entitlement is not None
    book = entitlement.book.inner if store else entitlement.book  # type: ignore[attr-defined]
    redis_used = await book.shared.used([key], 0)
    assert redis_used == [served]  # settled to what the backend counted


async def test_with_redis_down_a_replica_grants_its_local_share(
    sim: SimServer, fairq_factory: FairqFactory, redis_server: RedisProcess
) -> None:
    quota = QuotaConfig(user="ann", tokens_per_day=QUOTA)
    cluster = ClusterConfig(redis_server.url, replica_id="r0", lease_seconds=0.6, local_share=0.5)
    config = replace(make_config([sim_backend(sim)]), quotas=(quota,), cluster=cluster)
    replica = await fairq_factory(config)
    node = replica.core.cluster
    assert node is not None
    redis_server.stop()
    await until(lambda: not node.connected, timeout=10)
    tokens, refusals = await _send(replica, 14)
    one_request = tokens / (14 - len(refusals))
    assert QUOTA / 2 <= tokens <= QUOTA / 2 + one_request + MAX_TOKENS  # half: its share
    assert refusals
    registry = replica.core.telemetry.registry
    local = {"path": "local", "outcome": "granted"}
    assert registry.get_sample_value("fairq_cluster_quota_reservations_total", local) == 14 - len(
        refusals
    )


async def _hint(server: FairqServer, user: str) -> float | None:
    """Send one request of ``user``: None if served, else the refusal's retry hint (s)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        request = gen_request(max_tokens=MAX_TOKENS)
        try:
            async for _ in stub.Generate(request, metadata=(("x-fairq-user", user),)):
                pass
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
            trailers = dict(error.trailing_metadata() or ())
            return int(trailers["grpc-retry-pushback-ms"]) / 1000
    return None


@pytest.mark.parametrize(
    ("quota", "key"),
    [
        (
            # Reached by the first request's grant (its tokens are more than 10).
            QuotaConfig(user="ann", tokens_per_day=10),
            LimitKey(Scope.USER, "ann", None, Measure.TOKENS, Window.DAY),
        ),
        (
            QuotaConfig(user="ann", requests_per_minute=3),
            LimitKey(Scope.USER, "ann", None, Measure.REQUESTS, Window.MINUTE),
        ),
    ],
    ids=["tokens-per-day", "requests-per-minute"],
)
async def test_every_replica_hints_when_the_shared_book_grants_again(
    redis_url: str, sim: SimServer, fairq_factory: FairqFactory, quota: QuotaConfig,
    key: LimitKey,
) -> None:  # fmt: skip
    # Once had: the replica whose own grant reached the limit answered "retry in 1 s" on
    # every request (a daily quota: all day), the other the true time.
    replicas = []
    for name in ("r0", "r1"):
        cluster = ClusterConfig(redis_url, replica_id=name, lease_seconds=2.0)
        config = replace(make_config([sim_backend(sim)]), quotas=(quota,), cluster=cluster)
        replicas.append(await fairq_factory(config))
    entitlement = replicas[0].core.dispatcher.entitlement
    assert entitlement is not None
    shared = entitlement.book.shared  # type: ignore[attr-defined]
    limit = float(quota.tokens_per_day or quota.requests_per_minute or 0)
    hints: list[tuple[str, float]] = []
    for turn in range(40):  # alternately, until each replica refused three times
        replica = replicas[turn % 2]
        sent = time.monotonic()
        hint = await _hint(replica, "ann")
        if hint is None:
            continue
        # The shared book's own answer now: when a reservation is granted again.
        truth = await shared.reserve([LimitUse(key, 0.0, limit)], 0)
        assert isinstance(truth, Refusal), truth
        elapsed = time.monotonic() - sent
        assert abs(hint - truth.retry_after) <= 1.0 + elapsed, (turn, hint, truth)
        hints.append((f"r{turn % 2}", hint))
        if min(sum(1 for r, _ in hints if r == n) for n in ("r0", "r1")) >= 3:
            break
    assert {r for r, _ in hints} == {"r0", "r1"}, hints
