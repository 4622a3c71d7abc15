"""The shipped migrations build exactly the tables ``schema.py`` describes, on both engines;
the store's settings refuse what cannot work, naming the key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from prometheus_client import CollectorRegistry
from sqlalchemy import Connection

from fairq_server.config.loader import parse_config
from fairq_server.config.prices import PriceConfig, PriceError, check_prices
from fairq_server.config.schema import ConfigError
from fairq_server.config.store import StoreConfig, StoreError, engine_url
from fairq_server.store.engine import current_revision, head_revision, open_engine, upgrade
from fairq_server.store.schema import metadata
from fairq_server.store.service import Store


async def test_migrations_match_the_schema_and_rerun_as_no_ops(store_url: str) -> None:
    engine = await open_engine(StoreConfig(url=store_url))
    try:
        assert await current_revision(engine) is None
        await upgrade(engine)
        await upgrade(engine)  # a second start finds the schema current
        assert await current_revision(engine) == head_revision()

        def diff(conn: Connection) -> list[object]:
            return list(compare_metadata(MigrationContext.configure(conn), metadata))

        async with engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await engine.dispose()


def test_engine_urls_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine_url(StoreConfig()) == "sqlite+aiosqlite:///fairq.db"
    assert engine_url(StoreConfig(), "/var/lib/fairq/state.json") == (
        "sqlite+aiosqlite:////var/lib/fairq/fairq.db"
    )
    monkeypatch.setenv("FAIRQ_TEST_PW", "p@ss/word")
    config = StoreConfig(url="postgres://fairq@db:5432/x", password_env="FAIRQ_TEST_PW")
    assert engine_url(config) == "postgresql+asyncpg://fairq:p%40ss%2Fword@db:5432/x"
    with pytest.raises(StoreError, match=r"store\.url must start with"):
        StoreConfig(url="mysql://db/x")
    # Bounds are the schema's: checked where a file is read.
    with pytest.raises(ConfigError, match=r"store\.flush_seconds must be a finite number"):
        parse_config({"store": {"flush_seconds": float("nan")}})


def test_prices_are_checked() -> None:
    check_prices({"m": PriceConfig(1.0, 2.0)}, {"m"})
    with pytest.raises(PriceError, match=r"prices.m.output_per_million must be a finite number"):
        check_prices({"m": PriceConfig(1.0, float("inf"))}, {"m"})
    with pytest.raises(PriceError, match=r"prices.x: no configured backend serves model 'x'"):
        check_prices({"x": PriceConfig()}, {"m"})
    assert PriceConfig(2.0, 10.0).cost(1_000_000, 500_000) == pytest.approx(7.0)


async def test_the_default_sqlite_file_is_announced_with_its_full_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without [store] url fairq.db appears in the working directory: the log says where."""
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger="fairq_server.store.service")
    store = Store(StoreConfig(), "", {}, ("interactive",), "replica-a", CollectorRegistry())
    await store.start()
    try:
        assert (tmp_path / "fairq.db").exists()
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("store:")]
        assert f"in the SQLite file {tmp_path / 'fairq.db'} (set [store] url" in line
    finally:
        await store.close()
