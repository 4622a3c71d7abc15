"""Usage over time: the ledger summed per hour or day and per team, user or model.

The sums are made by the database (one row per bucket and group, however many requests the
ledger holds), bucketed on Unix time so both engines agree: PostgreSQL's ``extract(epoch)``,
SQLite's ``strftime('%s')`` on the UTC timestamps the ledger writes. Days are UTC days.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import BigInteger, ColumnElement, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.store.reports import GROUPINGS
from fairq_server.store.schema import usage

__all__ = ["MAX_BUCKETS", "MEASURES", "STEPS", "Series", "usage_series"]

STEPS = {"hour": 3600, "day": 86400}
MEASURES = ("output_tokens", "input_tokens", "cost", "requests")
# A plot of more buckets than this is unreadable and its query needlessly large.
MAX_BUCKETS = 800


@dataclass
class Series:
    """Usage per bucket for the groups of a range.

    Attributes:
        step: seconds per bucket (3600 or 86400).
        starts: the buckets' start times (Unix seconds), every bucket of the range, oldest
            first, empty ones included.
        values: per measure, per group (``None``: no team), one value per bucket.

    """

    step: int
    starts: list[int]
    values: dict[str, dict[str | None, list[float]]] = field(default_factory=dict)

    def totals(self, measure: str) -> dict[str | None, float]:
        """Return each group's sum of ``measure`` over the range."""
        return {g: sum(v) for g, v in self.values.get(measure, {}).items()}


def _bucket(engine: AsyncEngine, step: int) -> ColumnElement[int]:
    """Return the SQL for the bucket number (Unix time // step) of a row's ``ended_at``."""
    if engine.dialect.name == "sqlite":
        seconds: ColumnElement[int] = cast(func.strftime("%s", usage.c.ended_at), BigInteger)
    else:
        seconds = cast(func.floor(func.extract("epoch", usage.c.ended_at)), BigInteger)
    return seconds // step


async def usage_series(
    engine: AsyncEngine, by: str, step: str, since: float, until: float
) -> Series:
    """Sum the rows that ended in ``[since, until)`` per ``step`` and per ``by``.

    Raises:
        ValueError: ``by`` or ``step`` unknown, or the range spans more than
            :data:`MAX_BUCKETS` buckets.

    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {sorted(GROUPINGS)}, not {by[:20]!r}")
    seconds = STEPS.get(step)
    if seconds is None:
        raise ValueError(f"step must be one of {sorted(STEPS)}, not {step[:20]!r}")
    first, last = int(since // seconds), int((until - 1e-6) // seconds)
    if last - first + 1 > MAX_BUCKETS:
        raise ValueError(
            f"the range spans {last - first + 1} {step}s; at most {MAX_BUCKETS} are plotted"
        )
    column, bucket = GROUPINGS[by], _bucket(engine, seconds).label("bucket")
    query = (
        select(
            column.label("name"),
            bucket,
            func.count().label("requests"),
            func.coalesce(func.sum(usage.c.input_tokens), 0).label("input_tokens"),
            func.coalesce(func.sum(usage.c.output_tokens), 0).label("output_tokens"),
            func.coalesce(func.sum(usage.c.cost), 0.0).label("cost"),
            func.sum(case((usage.c.outcome == "finished", 1), else_=0)).label("finished"),
        )
        .where(usage.c.ended_at >= datetime.fromtimestamp(since, UTC))
        .where(usage.c.ended_at < datetime.fromtimestamp(until, UTC))
        .group_by(column, bucket)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    series = Series(seconds, [b * seconds for b in range(first, last + 1)])
    width = last - first + 1
    for measure in MEASURES:
        series.values[measure] = {}
    for r in rows:
        index = int(r.bucket) - first
        if not 0 <= index < width:  # cannot happen for rows inside the range; kept safe
            continue
        for measure in MEASURES:
            per_group = series.values[measure].setdefault(r.name, [0.0] * width)
            per_group[index] += float(getattr(r, measure) or 0)
    return series
