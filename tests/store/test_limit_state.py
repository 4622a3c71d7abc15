"""Quota and budget state in the store: calendar amounts outlive a restart (SQLite, PostgreSQL)."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime

import grpc
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select, update

from fairq_bench.postgres_process import PostgresProcess
from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import open_engine, upgrade
from fairq_server.store.period_counters import LimitState, period_of
from fairq_server.store.schema import limit_usage
from fairq_server.tenancy.books.book import (
    Grant,
    LimitKey,
    LimitUse,
    Measure,
    Refusal,
    Scope,
    Window,
)
from fairq_server.tenancy.books.local import LocalBook
from fairq_server.tenancy.books.persisted import PersistedBook, counter_name
from fairq_sim import SimServer

from ..conftest import FairqFactory, sim_backend
from .helpers import store_config, until

DAY = LimitKey(Scope.USER, "ann:1", "m", Measure.COST, Window.DAY)
MONTH = LimitKey(Scope.TEAM, "équipe «a»", None, Measure.TOKENS, Window.MONTH)
MINUTE = LimitKey(Scope.USER, "ann:1", "m", Measure.TOKENS, Window.MINUTE)
NAMES = [
    LimitKey(Scope.USER, "a:1", None, Measure.TOKENS, Window.DAY),
    LimitKey(Scope.USER, "a", "1", Measure.TOKENS, Window.DAY),
    LimitKey(Scope.USER, "x" * 3000, None, Measure.TOKENS, Window.DAY),
    LimitKey(Scope.TEAM, "a:1", None, Measure.TOKENS, Window.DAY),
]


async def _state(url: str, **config: float) -> tuple[LimitState, CollectorRegistry]:
    engine = await open_engine(StoreConfig(url=url))
    await upgrade(engine)
    registry = CollectorRegistry()
    return LimitState(engine, StoreConfig(url=url, **config), registry), registry  # type: ignore[arg-type]


async def test_amounts_are_summed_per_period_and_read_back(store_url: str) -> None:
    now = time.time()
    one, _ = await _state(store_url)
    two, _ = await _state(store_url)  # another replica on the same database
    one.add(counter_name(DAY), now, 1.5)
    one.add(counter_name(DAY), now, 0.25)
    two.add(counter_name(DAY), now, 2.0)
    one.add(counter_name(MONTH), now, 100)
    minute = LimitKey(Scope.USER, "ann", None, Measure.TOKENS, Window.MINUTE)
    one.add(counter_name(minute), now, 5)  # not kept
    for i, key in enumerate(NAMES):
        two.add(counter_name(key), now, i + 1)
    one.add(counter_name(MONTH), now - 40 * 86400, 7)  # an earlier month: stored, not current
    assert one.pending == 3 and two.pending == 5
    await one.flush()
    await two.flush()
    await two.flush()  # nothing held: nothing added twice
    three, _ = await _state(store_url)
    loaded = dict(await three.load(now))
    expected = {DAY: 3.75, MONTH: 100.0, **{k: float(i + 1) for i, k in enumerate(NAMES)}}
    assert loaded == {counter_name(k): v for k, v in expected.items()}
    for state in (one, two, three):
        await state.close()
        await state._engine.dispose()


async def test_a_restart_keeps_the_days_budget(store_url: str) -> None:
    """One process: settle, stop, start again: the book counts the day from where it was."""
    now = time.time()
    state, _ = await _state(store_url)
    book = PersistedBook(LocalBook(), state.add)
    uses = [LimitUse(DAY, 10, 12), LimitUse(MONTH, 1000, 5000), LimitUse(MINUTE, 10, 99)]
    grant = book.reserve_now(uses, now)
    assert isinstance(grant, Grant)
    book.settle_now(grant, [4, 300, 4], now)
    assert state.pending == 2  # the rolling minute is not kept
    await state.close()  # stopping writes what is held
    assert state.pending == 0
    await state._engine.dispose()

    again, _ = await _state(store_url)
    restarted = PersistedBook(LocalBook(), again.add)
    assert await restarted.restore(await again.load(time.time()), time.time()) == 2
    assert restarted.used_now([DAY, MONTH, MINUTE], time.time()) == [4, 300, 0]
    refusal = restarted.reserve_now([LimitUse(DAY, 10, 4)], time.time())
    assert isinstance(refusal, Refusal) and refusal.used == 4  # the day's budget is spent
    await again.close()
    await again._engine.dispose()


async def test_a_row_from_a_newer_fairq_is_skipped_the_rest_loads(store_url: str) -> None:
    now = time.time()
    state, _ = await _state(store_url)
    state.add(counter_name(DAY), now, 1)
    state.add(counter_name(MONTH), now, 2)
    await state.flush()
    async with state._engine.begin() as conn:
        await conn.execute(
            update(limit_usage).where(limit_usage.c.scope == "team").values(measure="watts")
        )
    book = PersistedBook(LocalBook(), state.add)
    assert await book.restore(await state.load(now), now) == 1
    assert book.used_now([DAY, MONTH], now) == [1, 0]
    await state.close()
    await state._engine.dispose()


async def test_a_database_that_goes_away_loses_nothing(
    postgres: PostgresProcess, postgres_url: str
) -> None:
    now = time.time()
    state, registry = await _state(postgres_url, flush_seconds=0.05)
    state.start()
    try:
        postgres.stop()
        state.add(counter_name(DAY), now, 1)
        await until(
            lambda: (registry.get_sample_value("fairq_limit_state_write_errors_total") or 0) >= 1
        )
        state.add(counter_name(DAY), now, 2)  # added to the held amount
        assert state.pending == 1
        postgres.start()
        # Stored, not merely taken for a write: stopping while a write is in flight could
        # cancel it after its commit (then the amount would be written again by close()).
        await until(lambda: state.stored, timeout=30)
    finally:
        await state.close()
    async with state._engine.connect() as conn:
        rows = (await conn.execute(select(limit_usage.c.amount, limit_usage.c.period))).all()
    assert [tuple(r) for r in rows] == [(3.0, period_of("day", now))]
    await state._engine.dispose()


async def test_stopping_with_the_database_down_counts_what_is_lost(
    postgres: PostgresProcess, postgres_url: str
) -> None:
    state, registry = await _state(postgres_url, stop_flush_seconds=0.5)
    postgres.stop()
    try:
        state.add(counter_name(DAY), time.time(), 1)
        await state.close()
        lost = registry.get_sample_value("fairq_limit_state_dropped_total", {"reason": "stopped"})
        assert lost == 1 and state.pending == 0
    finally:
        postgres.start()
        await state._engine.dispose()


@pytest.mark.parametrize(
    ("when", "day", "month"),
    [
        (datetime(2028, 2, 29, 23, 59, 59, tzinfo=UTC), "d2028-02-29", "M2028-02"),
        (datetime(2027, 1, 1, 0, 0, 0, tzinfo=UTC), "d2027-01-01", "M2027-01"),
    ],
)
def test_periods_are_utc(when: datetime, day: str, month: str) -> None:
    assert period_of("day", when.timestamp()) == day
    assert period_of("month", when.timestamp()) == month
    assert period_of("minute", when.timestamp()) is None


async def test_fairq_restarted_keeps_refusing_a_spent_daily_quota(
    store_url: str, fairq_factory: FairqFactory, sim: SimServer
) -> None:
    from fairq.v1 import scheduler_pb2_grpc
    from fairq_server.app import FairqServer
    from fairq_server.config.entitlement import QuotaConfig
    from tests.reliability.helpers import gen_request

    config = store_config(store_url, [sim_backend(sim)])
    config = replace(config, quotas=(QuotaConfig(user="ann", tokens_per_day=30),))

    async def send(server: FairqServer) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            try:
                request = gen_request(max_tokens=8)
                _ = [e async for e in stub.Generate(request, metadata=(("x-fairq-user", "ann"),))]
            except grpc.aio.AioRpcError as error:
                return error.code()
            return grpc.StatusCode.OK

    first = FairqServer(config)
    await first.start()
    codes = [await send(first) for _ in range(4)]
    await first.stop(grace=1.0)  # the day's amount is written on the way out
    assert codes[0] == grpc.StatusCode.OK
    assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED
    again = await fairq_factory(config)
    assert await send(again) == grpc.StatusCode.RESOURCE_EXHAUSTED  # not handed back
