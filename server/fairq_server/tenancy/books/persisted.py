"""A limit book whose calendar counters outlive a restart (their settled amounts go to the store).

Each settlement of a day or month counter of the dispatcher's book (one-process or the
cluster's) is also handed to ``record`` (the store's
:class:`~fairq_server.store.period_counters.LimitState`, which writes in the background), with the
time the grant was made, so the amount lands in the period it was counted in. At start,
:meth:`PersistedBook.restore` gives the stored amounts of the current periods back:

* a one-process book takes them as a reservation that is never settled, with no limit;
* the cluster's Redis book (:meth:`~fairq_server.tenancy.books.redis.RedisBook.restore`)
  takes them only into a Redis that does not hold them yet (one started empty), once per
  period, so replicas starting one after the other do not add them again.

Only settled (real) amounts are stored: what was reserved and in flight when the process
stopped is not usage.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fairq_server.store.period_counters import LimitState
from fairq_server.tenancy.books.book import (
    Grant,
    LimitKey,
    LimitUse,
    Measure,
    Refusal,
    Scope,
    Window,
)
from fairq_server.tenancy.checker import Entitlement, SyncBook

__all__ = ["PersistedBook", "Restorable", "counter_key", "counter_name", "keep_state"]

log = logging.getLogger(__name__)


def counter_name(key: LimitKey) -> tuple[str, str, str | None, str, str]:
    """Return ``key``'s fields as the store keeps them (``store.limits.CounterName``)."""
    return (key.scope.value, key.subject, key.model, key.measure.value, key.window.value)


def counter_key(name: Sequence[str | None]) -> LimitKey | None:
    """Return the key of stored fields; None (logged) for fields this fairq does not know."""
    scope, subject, model, measure, window = name
    try:
        return LimitKey(Scope(scope), str(subject), model, Measure(measure), Window(window))
    except ValueError as exc:
        log.warning("quota state: a stored counter of %r skipped: %s", subject, exc)
        return None


@runtime_checkable
class Restorable(Protocol):
    """A shared book that takes stored amounts only where it does not hold them yet."""

    async def restore(self, amounts: Sequence[tuple[LimitKey, float]]) -> int:
        """Add ``amounts`` to the current periods unless added before; return how many took."""
        ...


#: A counter's fields as the store keeps them (``store.limits.CounterName``).
Name = tuple[str, str, str | None, str, str]


@dataclass(frozen=True)
class _Token:
    inner: Grant
    granted_at: float


class PersistedBook:
    """``inner`` (a dispatcher's book), each calendar settlement also given to ``record``.

    Args:
        inner: the book that decides (one-process, or the cluster's).
        record: takes ``(counter name, granted at, amount)``; must not block (it buffers).

    """

    def __init__(self, inner: SyncBook, record: Callable[[Name, float, float], None]) -> None:
        self.inner = inner
        self._record = record

    def reserve_now(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Reserve in ``inner``; the grant remembers when, for the period of its settlement."""
        outcome = self.inner.reserve_now(uses, now)
        if isinstance(outcome, Refusal):
            return outcome
        return Grant(_Token(outcome, now), outcome.uses, outcome.used)

    def settle_now(self, grant: Grant, actual: Sequence[float], now: float) -> None:
        """Settle in ``inner``, then record the calendar counters' actual amounts."""
        token = grant.token
        if not isinstance(token, _Token):
            raise TypeError(f"limit book: not a grant of this book: {token!r}")
        self.inner.settle_now(token.inner, actual, now)
        for use, amount in zip(grant.uses, actual, strict=True):
            if use.key.window is not Window.MINUTE and math.isfinite(amount) and amount > 0:
                self._record(counter_name(use.key), token.granted_at, float(amount))

    def used_now(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """Each key's used amount, as ``inner`` counts it."""
        return self.inner.used_now(keys, now)

    async def restore(
        self, stored: Sequence[tuple[Sequence[str | None], float]], now: float
    ) -> int:
        """Give the stored amounts of the current periods back to ``inner``; return how many.

        A one-process book takes each as a reservation without a limit that is never settled;
        the cluster's book gives them to Redis (:class:`Restorable`), which takes them once.
        """
        chosen = []
        for name, amount in stored:
            key = counter_key(name)
            if key is not None and key.window is not Window.MINUTE and amount > 0:
                chosen.append((key, amount))
        shared = getattr(self.inner, "shared", None)
        if isinstance(shared, Restorable):
            taken = await shared.restore(chosen)
        else:
            taken = 0
            for key, amount in chosen:
                outcome = self.inner.reserve_now([LimitUse(key, amount, math.inf)], now)
                taken += isinstance(outcome, Grant)
        if chosen:
            log.info("quota state: %d of %d stored day and month amounts restored",
                     taken, len(chosen))  # fmt: skip
        return taken


async def keep_state(entitlement: Entitlement | None, state: LimitState, now: float) -> None:
    """Put ``tenancy``'s book under :class:`PersistedBook` on ``state``, restored from it.

    Called once at start, before the dispatcher runs. A store or Redis that fails the reading
    back is logged; serving starts anyway, with the day and month counted from zero.
    """
    if entitlement is None:
        return
    book = PersistedBook(entitlement.book, state.add)
    entitlement.book = book
    try:
        await book.restore(await state.load(now), now)
    except Exception as exc:
        log.error("quota state: the stored day and month amounts could not be read back, "
                  "so they count from zero: %s", exc)  # fmt: skip
