"""Usage reports: the ledger summed by team, user or model over a time range."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.store.schema import usage

__all__ = ["GROUPINGS", "ReportRow", "last_requests", "usage_report"]

GROUPINGS = {"team": usage.c.team, "user": usage.c.user_name, "model": usage.c.model}


@dataclass(frozen=True)
class ReportRow:
    """One team's, user's or model's usage over the range.

    Attributes:
        name: the team, user or model, verbatim (None: requests of no team).
        requests: requests that ended in the range, whatever their outcome.
        finished: of those, the ones that finished.
        input_tokens: prompt tokens.
        output_tokens: completion tokens.
        cost: summed cost of the priced rows (0 when no model was priced).

    """

    name: str | None
    requests: int
    finished: int
    input_tokens: int
    output_tokens: int
    cost: float


async def usage_report(
    engine: AsyncEngine, by: str, since: float, until: float | None = None
) -> list[ReportRow]:
    """Sum the rows that ended in ``[since, until)`` by ``by``, most output tokens first.

    Raises:
        ValueError: ``by`` is not team, user or model.

    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {sorted(GROUPINGS)}, not {by!r}")
    column = GROUPINGS[by]
    query = (
        select(
            column.label("name"),
            func.count().label("requests"),
            func.sum(case((usage.c.outcome == "finished", 1), else_=0)).label("finished"),
            func.coalesce(func.sum(usage.c.input_tokens), 0).label("input_tokens"),
            func.coalesce(func.sum(usage.c.output_tokens), 0).label("output_tokens"),
            func.coalesce(func.sum(usage.c.cost), 0.0).label("cost"),
        )
        .where(usage.c.ended_at >= datetime.fromtimestamp(since, UTC))
        .group_by(column)
        .order_by(func.sum(usage.c.output_tokens).desc(), column)
    )
    if until is not None:
        query = query.where(usage.c.ended_at < datetime.fromtimestamp(until, UTC))
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [
        ReportRow(
            r.name,
            int(r.requests),
            int(r.finished or 0),
            int(r.input_tokens),
            int(r.output_tokens),
            float(r.cost),
        )
        for r in rows
    ]


async def last_requests(
    engine: AsyncEngine, users: Collection[str], since: float
) -> dict[str, float]:
    """Return when each of ``users`` last had a request end (Unix time), since ``since``.

    Users with none in the range are absent. The range keeps the query on the ``ended_at``
    index (the ledger has no index by user); at most 500 users are asked about at once.
    """
    found: dict[str, float] = {}
    names = sorted(set(users))
    for start in range(0, len(names), 500):
        query = (
            select(usage.c.user_name, func.max(usage.c.ended_at).label("last"))
            .where(usage.c.ended_at >= datetime.fromtimestamp(since, UTC))
            .where(usage.c.user_name.in_(names[start : start + 500]))
            .group_by(usage.c.user_name)
        )
        async with engine.connect() as conn:
            for name, last in (await conn.execute(query)).all():
                if last.tzinfo is None:  # SQLite hands naive datetimes back (stored in UTC)
                    last = last.replace(tzinfo=UTC)
                found[str(name)] = last.timestamp()
    return found
