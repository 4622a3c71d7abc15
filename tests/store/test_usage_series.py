"""Usage over time: the database's sums per hour or day equal the rows', on both engines."""

from __future__ import annotations

import time

import pytest

from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import open_engine
from fairq_server.store.series import MAX_BUCKETS, usage_series

from .usage_rows import expected_series, row, write_rows


async def test_hourly_and_daily_sums_match_the_rows(store_url: str) -> None:
    now = time.time()
    hour = 3600
    rows = [
        row(now - 30, "ann", "alpha", "m1", 100, cost=0.5),
        row(now - 50, "bob", "alpha", "m1", 7, cost=0.25),
        row(now - 2 * hour - 10, "ann", "alpha", "m2", 40),
        row(now - 5 * hour, "cy", None, "m1", 3, inp=99),
        row(now - 20 * hour, "dee", "beta", "m2", 11, outcome="cancelled"),
        row(now - 3 * 86400, "dee", "beta", "m2", 1000),  # outside the 2-day range
    ]
    await write_rows(store_url, rows)
    engine = await open_engine(StoreConfig(url=store_url))
    try:
        for step, seconds, since in (
            ("hour", hour, now - 2 * 86400),
            ("day", 86400, now - 7 * 86400),
        ):
            series = await usage_series(engine, "team", step, since, now + 1)
            assert series.step == seconds
            assert series.starts[0] == int(since // seconds) * seconds
            for measure in ("output_tokens", "input_tokens", "cost", "requests"):
                want = expected_series(rows, "team", measure, seconds, since, now + 1)
                got = {
                    g: {series.starts[i]: round(v, 9) for i, v in enumerate(vs) if v}
                    for g, vs in series.values[measure].items()
                }
                assert got == want, (step, measure)  # costs here are exact binary fractions
        by_user = await usage_series(engine, "user", "hour", now - 86400, now + 1)
        assert by_user.totals("output_tokens") == {"ann": 140, "bob": 7, "cy": 3, "dee": 11}
        with pytest.raises(ValueError, match="at most"):
            await usage_series(engine, "team", "hour", now - (MAX_BUCKETS + 5) * hour, now)
        with pytest.raises(ValueError, match="step must be one of"):
            await usage_series(engine, "team", "week", now - 86400, now)
        with pytest.raises(ValueError, match="by must be one of"):
            await usage_series(engine, "tier", "hour", now - 86400, now)
    finally:
        await engine.dispose()
