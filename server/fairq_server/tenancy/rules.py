"""Which limits hold for a request: the quota and budget entries resolved per user, team, model.

Each entry of ``[[quotas]]`` and ``[[budgets]]`` becomes one :class:`Limit` per measure and
window it sets (``tokens_per_minute`` is tokens over a rolling minute, ``per_month`` is cost
over a calendar month). A request is held to its team's limits and to its user's: the user's
own entries, or else the ``user = "*"`` ones, model by model (an entry naming the user for a
model replaces the ``*`` entry for that model only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fairq_server.config.entitlement import ANY_USER, BudgetConfig, QuotaConfig
from fairq_server.tenancy.books.book import LimitKey, Measure, Scope, Window

__all__ = ["Applicable", "Limit", "LimitTable"]

# Resolved requests kept; past this the cache starts afresh (names come from callers).
_CACHE_ENTRIES = 16_384

_QUOTA_FIELDS = (
    ("tokens_per_minute", Measure.TOKENS, Window.MINUTE),
    ("tokens_per_day", Measure.TOKENS, Window.DAY),
    ("requests_per_minute", Measure.REQUESTS, Window.MINUTE),
)
_BUDGET_FIELDS = (
    ("per_day", Measure.COST, Window.DAY),
    ("per_month", Measure.COST, Window.MONTH),
)


@dataclass(frozen=True)
class Limit:
    """One limit of one entry.

    Attributes:
        entry: where it is configured (``quotas[2]``), for messages.
        kind: what it limits, as configured (``tokens_per_minute``, ``budget_per_day``): the
            label of refusal and warning metrics.
        scope: team or user.
        subject: the team or user named (``*``: every user without an entry of its own).
        model: the model counted (None: every model).
        measure: tokens, requests or cost.
        window: rolling minute, calendar day or month.
        limit: the amount allowed per window.
        hard: refused when reached (else: the idle-only band).

    """

    entry: str
    kind: str
    scope: Scope
    subject: str
    model: str | None
    measure: Measure
    window: Window
    limit: float
    hard: bool

    def key(self, subject: str) -> LimitKey:
        """Return the counter of this limit for ``subject`` (the user, for a ``*`` entry)."""
        return LimitKey(self.scope, subject, self.model, self.measure, self.window)

    def describe(self, subject: str) -> str:
        """Say which limit this is, for a caller or a log line."""
        model = f", model {self.model!r}" if self.model else ""
        mode = "hard" if self.hard else "soft"
        return f"{mode} {self.kind} of {self.scope.value} {subject!r}{model} ({self.entry})"


@dataclass(frozen=True)
class Applicable:
    """The limits that hold for one (user, team, model), with their counters.

    Attributes:
        limits: each limit, in the order of ``keys``.
        keys: each limit's counter.
        soft: indices of the soft limits (the band's check reads only these).
        hard: indices of the hard limits.

    """

    limits: tuple[Limit, ...]
    keys: tuple[LimitKey, ...]
    soft: tuple[int, ...]
    hard: tuple[int, ...]


_NONE = Applicable((), (), (), ())


class LimitTable:
    """The configured limits, indexed by subject.

    Args:
        quotas: the ``[[quotas]]`` entries (checked).
        budgets: the ``[[budgets]]`` entries (checked).
        labels: where each quota, then each budget, comes from, for messages (default: its
            place in the file, ``quotas[2]``).

    """

    def __init__(
        self,
        quotas: Sequence[QuotaConfig] = (),
        budgets: Sequence[BudgetConfig] = (),
        labels: Sequence[str] = (),
    ) -> None:
        self._teams: dict[str, list[Limit]] = {}
        self._users: dict[str, list[Limit]] = {}
        entries: list[
            tuple[str, QuotaConfig | BudgetConfig, tuple[tuple[str, Measure, Window], ...]]
        ]
        entries = [(f"quotas[{i}]", q, _QUOTA_FIELDS) for i, q in enumerate(quotas)]
        entries += [(f"budgets[{i}]", b, _BUDGET_FIELDS) for i, b in enumerate(budgets)]
        if labels:
            entries = [(label, e[1], e[2]) for label, e in zip(labels, entries, strict=True)]
        for entry, cfg, fields in entries:
            scope, subject = (Scope.TEAM, cfg.team) if cfg.team else (Scope.USER, cfg.user)
            index = self._teams if scope is Scope.TEAM else self._users
            for name, measure, window in fields:
                value = getattr(cfg, name)
                if value is None:
                    continue
                kind = name if measure is not Measure.COST else f"budget_{name}"
                limit = Limit(entry, kind, scope, subject, cfg.model or None, measure, window,
                              float(value), cfg.mode == "hard")  # fmt: skip
                index.setdefault(subject, []).append(limit)
        self.empty = not (self._teams or self._users)
        self.has_soft = any(
            not limit.hard for table in (self._teams, self._users)
            for limits in table.values() for limit in limits
        )  # fmt: skip
        self._cache: dict[tuple[str, str | None, str], Applicable] = {}
        # One key object per counter: a book's lookup then finds its own key by identity
        # (a team's key is asked for by each of its users).
        self._keys: dict[LimitKey, LimitKey] = {}

    def team_limits(self) -> list[Limit]:
        """Return every team's limits (for the per-team gauges)."""
        return [limit for limits in self._teams.values() for limit in limits]

    def applicable(self, user: str, team: str | None, model: str) -> Applicable:
        """Return the limits that hold for ``user`` of ``team`` asking ``model``."""
        if self.empty:
            return _NONE
        cache_key = (user, team, model)
        found = self._cache.get(cache_key)
        if found is not None:
            return found
        chosen: list[tuple[Limit, str]] = []
        if team is not None:
            chosen += [
                (lim, team) for lim in self._teams.get(team, ()) if lim.model in (None, model)
            ]
        own = self._users.get(user, [])
        overridden = {lim.model for lim in own}
        defaults = [lim for lim in self._users.get(ANY_USER, ()) if lim.model not in overridden]
        if user == ANY_USER:  # a user literally named "*" has the "*" entries, once
            defaults = []
        chosen += [(lim, user) for lim in [*own, *defaults] if lim.model in (None, model)]
        found = Applicable(
            limits=tuple(lim for lim, _ in chosen),
            keys=tuple(self._intern(lim.key(subject)) for lim, subject in chosen),
            soft=tuple(i for i, (lim, _) in enumerate(chosen) if not lim.hard),
            hard=tuple(i for i, (lim, _) in enumerate(chosen) if lim.hard),
        )
        if len(self._cache) >= _CACHE_ENTRIES:
            self._cache.clear()
            self._keys.clear()
        self._cache[cache_key] = found
        return found

    def _intern(self, key: LimitKey) -> LimitKey:
        return self._keys.setdefault(key, key)
