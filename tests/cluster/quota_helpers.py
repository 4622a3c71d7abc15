"""Helpers of the Redis limit book's tests: replicas' books and a one-process fallback."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from fairq_server.cluster.connection import connect
from fairq_server.config.cluster import ClusterConfig
from fairq_server.tenancy.books.book import (
    Grant,
    LimitBook,
    LimitKey,
    LimitUse,
    Measure,
    Refusal,
    Scope,
    Window,
)
from fairq_server.tenancy.books.redis import RedisBook


class CountingBook(LimitBook):
    """A fallback for the tests: plain sums per key, no windows (what was granted locally)."""

    def __init__(self) -> None:
        self.sums: dict[LimitKey, float] = {}
        self.limits_seen: list[float] = []

    async def reserve(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        self.limits_seen += [u.limit for u in uses]
        for use in uses:
            if self.sums.get(use.key, 0.0) >= use.limit:
                return Refusal(use, self.sums.get(use.key, 0.0), 1.0)
        for use in uses:
            self.sums[use.key] = self.sums.get(use.key, 0.0) + use.amount
        return Grant(None, tuple(uses), tuple(self.sums[u.key] for u in uses))

    async def settle(self, grant: Grant, actual: Sequence[float]) -> None:
        for use, amount in zip(grant.uses, actual, strict=True):
            self.sums[use.key] += amount - use.amount

    async def used(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        return [self.sums.get(k, 0.0) for k in keys]


def tpm(subject: str, model: str | None = None, window: Window = Window.MINUTE) -> LimitKey:
    """A user's tokens counter."""
    return LimitKey(Scope.USER, subject, model, Measure.TOKENS, window)


@contextlib.asynccontextmanager
async def books(
    redis_url: str, count: int, share: float = 1.0
) -> AsyncIterator[list[tuple[RedisBook, CountingBook, list[BaseException]]]]:
    """``count`` replicas' books on ``redis_url`` (own clients), with their fallbacks and
    the Redis failures each was told of."""
    clients = [
        connect(ClusterConfig(redis_url, replica_id=f"r{i}"), timeout=0.5) for i in range(count)
    ]
    made = []
    for client in clients:
        fallback, failures = CountingBook(), list[BaseException]()
        book = RedisBook(client, "t", fallback, share=lambda: share, lost=failures.append)
        made.append((book, fallback, failures))
    try:
        yield made
    finally:
        for client in clients:
            await client.aclose()
