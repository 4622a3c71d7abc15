"""Where users and teams stand against their quotas and budgets, for the console's queue view.

Read on the event loop, like the rest of :mod:`fairq_server.observe.live`, from the
dispatcher's :class:`~fairq_server.tenancy.checker.Entitlement`: no counter is scanned. A
:class:`StandingReader` is made once per view and asked about the users the view lists (its
first rows per model) and about the configured team limits (their number is the
configuration's), and it reads each counter at most once per view: a team's counter is shared
by all its waiting users. In a cluster the book answers from what Redis last told this replica
(see :class:`~fairq_server.tenancy.books.cluster.ClusterBook`), so the figures are a few
requests behind at most; the console shows the highest over the replicas.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fairq_server.tenancy.books.book import LimitKey, Window
from fairq_server.tenancy.books.local import period_end
from fairq_server.tenancy.checker import WARN_AT, Entitlement
from fairq_server.tenancy.rules import Limit

__all__ = ["LimitRow", "StandingReader", "TeamRow"]

OVER = "over"
WARN = "warn"


@dataclass(frozen=True)
class LimitRow:
    """One limit that holds for a user (its own, or its team's), and its use now.

    Attributes:
        scope: ``team`` or ``user``.
        subject: the team or user counted.
        kind: the limit as configured (``tokens_per_minute``, ``budget_per_day``, ...).
        model: the model counted ("" : every model).
        mode: ``hard`` (refused when reached) or ``soft`` (the idle-only band).
        used: the amount used in the current window (tokens, requests or cost units).
        limit: the amount allowed per window.
        state: ``over`` (reached), ``warn`` (at 80 % or more) or empty.
        until: for a reached hard limit, when it admits again (epoch seconds; None: not
            reached, or soft).

    """

    scope: str
    subject: str
    kind: str
    model: str
    mode: str
    used: float
    limit: float
    state: str
    until: float | None = None


@dataclass(frozen=True)
class TeamRow:
    """A team with configured limits: its weight, and its use of each limit."""

    team: str
    weight: float
    limits: list[LimitRow] = field(default_factory=list)


class StandingReader:
    """Reads limits' use for one view; each counter once (see the module's docstring).

    Args:
        entitlement: the dispatcher's quotas and budgets.
        team_weights: the configured teams' weights (a team not named has weight 1).

    """

    def __init__(self, entitlement: Entitlement, team_weights: Mapping[str, float]) -> None:
        self._entitlement = entitlement
        self._weights = team_weights
        self._now = entitlement.clock()
        # (the limit's id, its counter) -> row: a dataclass hashes every field, enums included,
        # and a limit lives in the entitlement's table while the view is read.
        self._rows: dict[tuple[int, LimitKey], LimitRow] = {}
        self._users: dict[tuple[str, str | None, str], list[LimitRow]] = {}

    def for_user(self, user: str, team: str | None, model: str) -> list[LimitRow]:
        """Return each limit holding for ``user`` of ``team`` asking ``model``, with its use."""
        found = self._users.get((user, team, model))
        if found is None:
            applicable = self._entitlement.applicable(user, team, model)
            found = [self._row(lim, key) for lim, key in zip(applicable.limits, applicable.keys,
                                                             strict=True)]  # fmt: skip
            self._users[(user, team, model)] = found
        return found

    def teams(self) -> list[TeamRow]:
        """Return every team with a configured limit, by name, with its use of each."""
        per_team: dict[str, list[LimitRow]] = {}
        for limit in self._entitlement.team_limits():
            row = self._row(limit, limit.key(limit.subject))
            per_team.setdefault(limit.subject, []).append(row)
        return [
            TeamRow(team, self._weights.get(team, 1.0), rows)
            for team, rows in sorted(per_team.items())
        ]

    def _row(self, limit: Limit, key: LimitKey) -> LimitRow:
        found = self._rows.get((id(limit), key))
        if found is not None:
            return found
        [used] = self._entitlement.book.used_now([key], self._now)
        state, until = "", None
        if used >= limit.limit:
            state = OVER
            if limit.hard:
                until = self._now + self._retry_after(limit, key)
        elif used >= WARN_AT * limit.limit:
            state = WARN
        row = LimitRow(
            scope=key.scope.value,
            subject=key.subject,
            kind=limit.kind,
            model=limit.model or "",
            mode="hard" if limit.hard else "soft",
            used=round(used, 6),
            limit=limit.limit,
            state=state,
            until=round(until, 3) if until is not None else None,
        )
        self._rows[(id(limit), key)] = row
        return row

    def _retry_after(self, limit: Limit, key: LimitKey) -> float:
        retry = self._entitlement.retry_after(key, limit.limit, self._now)
        if retry is not None:
            return retry
        # The book does not know (a replica that was not refused itself): the window's end
        # bounds it, a rolling minute's at most 60 s.
        if key.window is Window.MINUTE:
            return 60.0
        return period_end(key.window, self._now) - self._now
