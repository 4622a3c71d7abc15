"""The dispatcher's side of quotas and budgets: admit, reserve, settle, and the soft band.

Called from the dispatcher's loop only, synchronously: the book must answer without a wait
(:class:`SyncBook`; the one-process :class:`~fairq_server.tenancy.books.local.LocalBook`
does). Per request:

- at admission, :meth:`Entitlement.refusal`: a hard limit already reached refuses the request
  before it queues;
- at dispatch, :meth:`Entitlement.reserve`: the most the request may use (prompt estimate plus
  ``max_tokens``, one request, their price) is granted against every limit that holds for it,
  or a hard limit reached meanwhile refuses it. Soft limits are counted but never refuse;
- at the end, :meth:`Entitlement.settle` with the backend's usage (nothing, if the attempt
  never produced a token: a retry reserves again);
- while it waits, :meth:`Entitlement.demoted`: over a soft limit (its own or its team's), it is
  in the idle-only band (see :mod:`fairq_server.scheduling.picking`).

A warning is logged, and counted, when a limit's use reaches 80 %: once per counter and window.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.prices import PriceConfig
from fairq_server.errors import QuotaExceededError
from fairq_server.tenancy.books.book import (
    Claim,
    Grant,
    LimitKey,
    LimitUse,
    Measure,
    Refusal,
    Window,
)
from fairq_server.tenancy.books.local import period_of
from fairq_server.tenancy.metrics import EntitlementMetrics
from fairq_server.tenancy.rules import Applicable, Limit, LimitTable

__all__ = ["WARN_AT", "Entitlement", "SyncBook"]

log = logging.getLogger(__name__)

#: Fraction of a limit at which a warning is logged and counted.
WARN_AT = 0.8
# Warned (counter, window) pairs remembered; past this the memory starts afresh.
_WARNED_ENTRIES = 65_536
# Seconds between refreshes of the per-team gauges.
_GAUGE_EVERY = 1.0


class SyncBook(Protocol):
    """A limit book the dispatcher may call without waiting (see the module's docstring)."""

    def reserve_now(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """See :meth:`~fairq_server.tenancy.books.book.LimitBook.reserve`."""
        ...

    def settle_now(self, grant: Grant, actual: Sequence[float], now: float) -> None:
        """See :meth:`~fairq_server.tenancy.books.book.LimitBook.settle`."""
        ...

    def used_now(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """See :meth:`~fairq_server.tenancy.books.book.LimitBook.used`."""
        ...


class Entitlement:
    """Quotas and budgets, checked against a book (see the module's docstring).

    Args:
        book: the counters (one process: a ``LocalBook``).
        metrics: where refusals, warnings, demotions and team gauges go (None: nowhere).
        clock: wall-clock seconds (calendar windows are UTC days and months); settable.

    """

    def __init__(
        self,
        book: SyncBook,
        metrics: EntitlementMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.book = book
        self._metrics = metrics
        self.clock = clock
        self._table = LimitTable()
        self._prices: Mapping[str, PriceConfig] = {}
        self._warned: dict[LimitKey, int] = {}
        self._next_gauges = 0.0

    def configure(
        self,
        quotas: Sequence[QuotaConfig],
        budgets: Sequence[BudgetConfig],
        prices: Mapping[str, PriceConfig],
        labels: Sequence[str] = (),
    ) -> None:
        """Apply (checked) entries and prices; counters so far are kept.

        ``labels`` name where each quota, then each budget, comes from in messages (default:
        its place in the file).
        """
        self._table = LimitTable(quotas, budgets, labels)
        self._prices = prices
        self._next_gauges = 0.0
        if self._metrics is not None:
            self._metrics.clear_team_limits()

    @property
    def active(self) -> bool:
        """Whether any quota or budget is configured."""
        return not self._table.empty

    @property
    def has_soft(self) -> bool:
        """Whether any soft limit is configured (else the band is never asked)."""
        return self._table.has_soft

    def refusal(self, user: str, team: str | None, model: str) -> QuotaExceededError | None:
        """Return the refusal of a request whose hard limit is already reached, if one is."""
        found = self._table.applicable(user, team, model)
        if not found.hard:
            return None
        now = self.clock()
        keys = [found.keys[i] for i in found.hard]
        for i, used in zip(found.hard, self.book.used_now(keys, now), strict=True):
            limit = found.limits[i]
            if used >= limit.limit:
                # The book says when; a reservation of nothing asks it without granting. A
                # book that cannot say (a replica that only learnt the amount from its own
                # grants, with no refusal of the shared book on record) does not refuse here:
                # the request is reserved at dispatch, where the shared book decides and says
                # when. A guessed time would be wrong on that replica for every request.
                answer = self.book.reserve_now([LimitUse(found.keys[i], 0.0, limit.limit)], now)
                if isinstance(answer, Refusal):
                    return self._refused(limit, found.keys[i].subject, used, answer.retry_after)
        return None

    def reserve(
        self, user: str, team: str | None, model: str, prompt_tokens: int, max_tokens: int
    ) -> Claim | QuotaExceededError | None:
        """Reserve a request's most against its limits (None: no limit holds for it)."""
        found = self._table.applicable(user, team, model)
        if not found.limits:
            return None
        amounts = self._amounts(found, model, prompt_tokens, max_tokens, 1.0)
        uses = [
            LimitUse(key, amount, limit.limit if limit.hard else math.inf)
            for key, amount, limit in zip(found.keys, amounts, found.limits, strict=True)
        ]
        now = self.clock()
        answer = self.book.reserve_now(uses, now)
        if isinstance(answer, Refusal):
            limit = found.limits[uses.index(answer.use)]
            return self._refused(limit, answer.use.key.subject, answer.used, answer.retry_after)
        for limit, use, used in zip(found.limits, uses, answer.used, strict=True):
            if used >= WARN_AT * limit.limit:
                self._warn(limit, use.key, used, now)
        return Claim(answer, model)

    def settle(self, claim: Claim, prompt_tokens: int, completion_tokens: int) -> None:
        """Replace a claim's reserved amounts by what the request used."""
        grant = claim.grant
        requests = 1.0 if prompt_tokens + completion_tokens > 0 else 0.0
        price = self._prices.get(claim.model)
        actual = [
            _amount(use.key.measure, price, prompt_tokens, completion_tokens, requests)
            for use in grant.uses
        ]
        self.book.settle_now(grant, actual, self.clock())

    def demoted(self, user: str, team: str | None, model: str) -> bool:
        """Whether the user (or its team) is over a soft limit for ``model`` now."""
        found = self._table.applicable(user, team, model)
        if not found.soft:
            return False
        keys = [found.keys[i] for i in found.soft]
        used = self.book.used_now(keys, self.clock())
        return any(u >= found.limits[i].limit for i, u in zip(found.soft, used, strict=True))

    def applicable(self, user: str, team: str | None, model: str) -> Applicable:
        """Return the limits that hold for ``user`` of ``team`` asking ``model`` (for reports)."""
        return self._table.applicable(user, team, model)

    def team_limits(self) -> list[Limit]:
        """Return every team's configured limits (for reports; bounded by the configuration)."""
        return self._table.team_limits()

    def retry_after(self, key: LimitKey, limit: float, now: float) -> float | None:
        """Return the seconds until a reached hard limit admits again (None: the book can't say).

        Ask only for a key whose used amount reached ``limit``: the question is a reservation of
        nothing, which a book refuses then without counting anything.
        """
        answer = self.book.reserve_now([LimitUse(key, 0.0, limit)], now)
        return answer.retry_after if isinstance(answer, Refusal) else None

    def count_demotion(self, *, served_from_band: bool) -> None:
        """Count a pick that passed over the band, or one served from it."""
        if self._metrics is not None:
            counter = self._metrics.band_served if served_from_band else self._metrics.demotions
            counter.inc()

    def tick(self) -> None:
        """Refresh the per-team gauges (at most once a second; called every dispatch pass)."""
        if self._metrics is None or self._table.empty:
            return
        now = self.clock()
        if now < self._next_gauges:
            return
        self._next_gauges = now + _GAUGE_EVERY
        m = self._metrics
        limits = self._table.team_limits()
        keys = [limit.key(limit.subject) for limit in limits]
        for limit, used in zip(limits, self.book.used_now(keys, now), strict=True):
            labels = (m.team_labels.label(limit.subject), limit.kind, limit.model or "",
                      "hard" if limit.hard else "soft")  # fmt: skip
            m.set_team_limit(labels, used, limit.limit)

    # -- helpers ------------------------------------------------------------------------------

    def _amounts(
        self, found: Applicable, model: str, prompt: int, completion: int, requests: float
    ) -> list[float]:
        price = self._prices.get(model)
        return [_amount(key.measure, price, prompt, completion, requests) for key in found.keys]

    def _refused(self, limit: Limit, subject: str, used: float, retry: float) -> QuotaExceededError:
        if self._metrics is not None:
            self._metrics.refusals.labels(limit.kind, limit.scope.value).inc()
        seconds = max(1, math.ceil(retry))
        message = (
            f"{limit.describe(subject)} reached: {_figure(used)} of {_figure(limit.limit)} "
            f"used; retry in {seconds} s"
        )
        return QuotaExceededError(message, retry_after=retry, limit=limit.kind)

    def _warn(self, limit: Limit, key: LimitKey, used: float, now: float) -> None:
        window = int(now // 60) if key.window is Window.MINUTE else period_of(key.window, now)
        if self._warned.get(key) == window:
            return
        if len(self._warned) >= _WARNED_ENTRIES:
            self._warned.clear()
        self._warned[key] = window
        log.warning(
            "%s at %d%% of its limit: %s of %s used",
            limit.describe(key.subject), min(int(100 * used / limit.limit), 999),
            _figure(used), _figure(limit.limit),
        )  # fmt: skip
        if self._metrics is not None:
            self._metrics.warnings.labels(limit.kind, limit.scope.value).inc()


def _amount(
    measure: Measure, price: PriceConfig | None, prompt: int, completion: int, requests: float
) -> float:
    if measure is Measure.TOKENS:
        return float(prompt + completion)
    if measure is Measure.REQUESTS:
        return requests
    return price.cost(prompt, completion) if price is not None else 0.0


def _figure(value: float) -> str:
    """Write an amount for a person: whole numbers plainly, costs to four significant digits."""
    return str(int(value)) if value == int(value) else f"{value:.4g}"
