"""Ledger rows written straight into a store, at chosen times, for the usage views' tests."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import open_engine, upgrade
from fairq_server.store.schema import usage

_ids = itertools.count()


def row(ended_at: float, user: str, team: str | None, model: str, out: int, **more: Any) -> dict:  # type: ignore[type-arg]
    """One usage row ending at ``ended_at`` (Unix time) with ``out`` output tokens."""
    return {
        "id": f"t{next(_ids):030d}",
        "ended_at": datetime.fromtimestamp(ended_at, UTC),
        "request_id": f"r{next(_ids)}",
        "user_name": user,
        "team": team,
        "model": model,
        "backend": "sim-a",
        "tier": "batch",
        "input_tokens": more.get("inp", 10),
        "output_tokens": out,
        "cost": more.get("cost"),
        "queue_seconds": None,
        "ttft_seconds": None,
        "outcome": more.get("outcome", "finished"),
        "replica": "test",
    }


async def write_rows(url: str, rows: list[dict]) -> None:  # type: ignore[type-arg]
    """Insert ``rows`` into the ledger at ``url`` (its schema upgraded first)."""
    engine = await open_engine(StoreConfig(url=url))
    try:
        await upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(usage.insert(), rows)
    finally:
        await engine.dispose()


def expected_series(
    rows: list[dict],
    key: str,
    measure: str,
    step: int,
    since: float,
    until: float,  # type: ignore[type-arg]
) -> dict[str | None, dict[int, float]]:
    """Sum ``rows`` by ``key`` and bucket start, as the series should (the oracle)."""
    out: dict[str | None, dict[int, float]] = {}
    for r in rows:
        t = r["ended_at"].timestamp()
        if not since <= t < until:
            continue
        start = int(t // step) * step
        value = 1.0 if measure == "requests" else float(r[measure] or 0)
        per = out.setdefault(r[key], {})
        per[start] = per.get(start, 0.0) + value
    # Buckets summing to nothing are left out, as the test leaves them out of the series.
    return {g: {s: v for s, v in per.items() if v} for g, per in out.items()}
