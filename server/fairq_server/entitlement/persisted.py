"""A limit book whose calendar counters outlive a restart (their settled amounts go to the store).

:class:`PersistedBook` wraps either book. Each settlement of a day or month counter is also
handed to ``record`` (the store's :class:`~fairq_server.store.limits.LimitState`, which writes
in the background), with the time the grant was made, so the amount lands in the period it was
counted in. At start, :meth:`PersistedBook.restore` gives the stored amounts of the current
periods back to the book:

* a one-process book takes them as a reservation that is never settled, with no limit;
* a Redis book (:meth:`~fairq_server.entitlement.redis_book.RedisBook.restore`) takes them
  only into a Redis that does not hold them yet (one started empty), once per period, so
  replicas starting one after the other do not add them again.

Only settled (real) amounts are stored: what was reserved and in flight when the process
stopped is not usage.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fairq_server.entitlement.book import Grant, LimitBook, LimitKey, LimitUse, Refusal, Window

__all__ = ["PersistedBook", "Restorable"]

log = logging.getLogger(__name__)


@runtime_checkable
class Restorable(Protocol):
    """A shared book that takes stored amounts only where it does not hold them yet."""

    async def restore(self, amounts: Sequence[tuple[LimitKey, float]]) -> int:
        """Add ``amounts`` to the current periods unless added before; return how many took."""
        ...


@dataclass(frozen=True)
class _Token:
    inner: Grant
    granted_at: float


class PersistedBook(LimitBook):
    """``inner``, with each calendar settlement also given to ``record(key, when, amount)``.

    Args:
        inner: the book that decides (one-process or Redis).
        record: takes a settled amount; must not block (it only buffers).

    """

    def __init__(self, inner: LimitBook, record: Callable[[LimitKey, float, float], None]) -> None:
        self.inner = inner
        self._record = record

    async def reserve(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Reserve in ``inner``; the grant remembers when, for the period of its settlement."""
        outcome = await self.inner.reserve(uses, now)
        if isinstance(outcome, Refusal):
            return outcome
        return Grant(_Token(outcome, now), outcome.uses, outcome.used)

    async def settle(self, grant: Grant, actual: Sequence[float]) -> None:
        """Settle in ``inner``, then record the calendar counters' actual amounts."""
        token = grant.token
        if not isinstance(token, _Token):
            raise TypeError(f"limit book: not a grant of this book: {token!r}")
        await self.inner.settle(token.inner, actual)
        for use, amount in zip(grant.uses, actual, strict=True):
            if use.key.window is not Window.MINUTE and math.isfinite(amount) and amount > 0:
                self._record(use.key, token.granted_at, float(amount))

    async def used(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """Each key's used amount, as ``inner`` counts it."""
        return await self.inner.used(keys, now)

    async def restore(self, amounts: Sequence[tuple[LimitKey, float]], now: float) -> int:
        """Give the stored amounts of the current periods back to ``inner``; return how many."""
        chosen = [(k, a) for k, a in amounts if k.window is not Window.MINUTE and a > 0]
        if isinstance(self.inner, Restorable):
            taken = await self.inner.restore(chosen)
        else:
            taken = 0
            for key, amount in chosen:
                outcome = await self.inner.reserve([LimitUse(key, amount, math.inf)], now)
                taken += isinstance(outcome, Grant)
        if chosen:
            log.info("quota state: %d of %d stored day and month amounts restored",
                     taken, len(chosen))  # fmt: skip
        return taken
