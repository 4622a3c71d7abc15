"""The ledger's writer: batches, the bounded buffer, a database that goes away and comes back."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.postgres_process import PostgresProcess
from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import open_engine, upgrade
from fairq_server.store.ledger import Ledger
from fairq_server.store.records import UsageRecord
from fairq_sim import SimServer

from ..conftest import FairqFactory, sim_backend
from .helpers import PRICES, counter, read_rows, store_config, until


def entry(n: int, model: str = "sim") -> UsageRecord:
    return UsageRecord(time.time(), f"r-{n}", "ann", "red", model, "sim-a", "standard",
                       10, 20, 0.01, 0.02, "finished")  # fmt: skip


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return float(registry.get_sample_value(name, labels) or 0.0)


async def test_full_batches_go_at_once_part_batches_at_the_interval(store_url: str) -> None:
    config = StoreConfig(url=store_url, batch_rows=5, flush_seconds=3600)
    engine = await open_engine(config)
    await upgrade(engine)
    commits: list[int] = []
    event.listen(engine.sync_engine, "commit", lambda conn: commits.append(1))
    registry = CollectorRegistry()
    ledger = Ledger(engine, config, PRICES, "replica-1", registry)
    ledger.start()
    try:
        for n in range(12):
            ledger.record(entry(n))
        # Two full batches are written without waiting for the (hour-long) interval ...
        await until(lambda: sample(registry, "fairq_ledger_rows_written_total") == 10)
        assert ledger.pending == 2
        assert len(commits) == 2
    finally:
        await ledger.close()  # ... the part batch when the ledger stops
    assert len(commits) == 3 and ledger.pending == 0
    rows = await read_rows(store_url)
    assert sorted(r["request_id"] for r in rows) == sorted(f"r-{n}" for n in range(12))
    assert {r["replica"] for r in rows} == {"replica-1"}
    assert rows[0]["cost"] == pytest.approx((10 * 2.0 + 20 * 10.0) / 1e6)
    await engine.dispose()


async def test_a_full_buffer_drops_and_counts(tmp_path: Path) -> None:
    config = StoreConfig(url=f"sqlite:///{tmp_path / 'f.db'}", buffer_rows=4, batch_rows=100)
    engine = await open_engine(config)
    await upgrade(engine)
    registry = CollectorRegistry()
    ledger = Ledger(engine, config, {}, "r", registry)  # writer not started: rows pile up
    for n in range(7):
        ledger.record(entry(n, model="unpriced"))
    assert ledger.pending == 4
    assert sample(registry, "fairq_ledger_rows_dropped_total", reason="buffer_full") == 3
    await ledger.flush()
    rows = await read_rows(config.url)
    assert [r["request_id"] for r in rows] == ["r-0", "r-1", "r-2", "r-3"]
    assert rows[0]["cost"] is None  # no price for the model: unknown, not free
    await engine.dispose()


async def test_postgres_stopped_mid_run_serving_continues_rows_land_later(
    sim: SimServer,
    fairq_factory: FairqFactory,
    postgres: PostgresProcess,
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await fairq_factory(store_config(postgres_url, [sim_backend(sim)]))
    assert server.store is not None
    md = (("x-fairq-user", "olga"),)

    async def serve(n: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for i in range(n):
                req = scheduler_pb2.GenerateRequest(
                    model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
                )
                events = [r async for r in stub.Generate(req, metadata=md)]
                assert events[-1].WhichOneof("event") == "finished", i

    await serve(3)
    await until(lambda: counter(server, "fairq_ledger_rows_written_total") == 3)
    caplog.set_level(logging.WARNING, logger="fairq_server.store.ledger")
    postgres.stop()
    try:
        started = time.monotonic()
        await serve(5)  # the database is down: requests are served all the same
        assert time.monotonic() - started < 10
        await until(lambda: counter(server, "fairq_ledger_write_errors_total") >= 2)
        assert server.store.ledger.pending == 5
        assert counter(server, "fairq_ledger_rows_pending") == 5
        errors = counter(server, "fairq_ledger_write_errors_total")
        assert counter(server, "fairq_ledger_rows_unwritten_total") >= errors
        failures = [r for r in caplog.records if "usage ledger: writing" in r.getMessage()]
        assert len(failures) == 1  # logged once per interval, not once per retry
    finally:
        await asyncio.to_thread(postgres.start)
    await until(lambda: counter(server, "fairq_ledger_rows_written_total") == 8, timeout=15)
    rows = await read_rows(postgres_url)
    assert len(rows) == 8 and {r["outcome"] for r in rows} == {"finished"}
    assert len({r["id"] for r in rows}) == 8
    assert counter(server, "fairq_ledger_rows_dropped_total", {"reason": "buffer_full"}) == 0
