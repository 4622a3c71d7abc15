"""What the store tests share: a fairq config with a store, reading the ledger's rows back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import select

from fairq_server.config.prices import PriceConfig
from fairq_server.config.schema import BackendConfig, Config, HttpConfig, KeyConfig
from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import open_engine
from fairq_server.store.schema import usage

from ..conftest import make_config

PRICES = {"sim": PriceConfig(input_per_million=2.0, output_per_million=10.0)}


def store_config(
    url: str,
    backends: list[BackendConfig],
    *,
    keys: tuple[KeyConfig, ...] = (),
    store: dict[str, Any] | None = None,
    **scheduler: object,
) -> Config:
    """A loopback fairq with both doors, the store at ``url`` and prices for model 'sim'."""
    config = make_config(backends, keys=keys, **scheduler)
    settings = StoreConfig(url=url, flush_seconds=0.05, key_poll_seconds=0.1, **(store or {}))
    return replace(config, http=HttpConfig(listen="127.0.0.1:0"), store=settings, prices=PRICES)


async def read_rows(url: str) -> list[dict[str, Any]]:
    """Every usage row at ``url``, oldest first, read through an engine of its own."""
    engine = await open_engine(StoreConfig(url=url))
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(usage).order_by(usage.c.ended_at))).all()
        return [dict(row._mapping) for row in rows]
    finally:
        await engine.dispose()


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` (state of another task or server: nothing to await)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def counter(server: Any, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of a metric sample of ``server``'s registry (0 if absent)."""
    value = server.core.telemetry.registry.get_sample_value(name, labels or {})
    return float(value or 0.0)
