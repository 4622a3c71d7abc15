"""Team weights, quotas and budgets managed live: checked, stored, audited, merged with the file.

One class, :class:`ManagedEntitlement`, is what the Admin RPCs, the console's forms and (through
the RPCs) ``fairq teams`` / ``fairq limits`` call. A change is checked by the configuration
file's own rules (:func:`~fairq_server.tenancy.teams.check_teams`,
:func:`~fairq_server.config.entitlement.check_entitlement`: one place for them), written to
the store (which raises the version every replica polls), recorded in the audit log, and then
applied here at once and on the other replicas within one poll.

The override rule: the entries in force are the configuration file's, where an entry of the
store with the same subject replaces the file's (a team by name; a quota or a budget by team or
user and model), and the store's other entries are added. Deleting a stored entry brings the
file's back, if it has one; the file's own entries are changed by editing the file. A stored
entry that no longer passes the checks after a reload (a budget whose model lost its price) is
left out, with a warning, until the file or the entry is fixed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig, check_entitlement
from fairq_server.config.teams import TeamConfig, check_teams
from fairq_server.errors import InvalidRequestError
from fairq_server.names import MAX_NAME_CHARS, check_name
from fairq_server.store.audit import AuditLog
from fairq_server.store.entitlement import (
    LimitEntry,
    Stored,
    StoredEntitlement,
    limit_kind,
    subject_of,
)
from fairq_server.tenancy.limit_settings import LimitSettings

__all__ = ["Effective", "ManagedEntitlement", "check_limit", "check_team", "effective"]

log = logging.getLogger(__name__)

FILE, STORE = "file", "store"


class _Served(Protocol):
    @property
    def models(self) -> Sequence[str]:
        """The models a configured backend serves."""


class Config(LimitSettings, Protocol):
    """What the managed entitlement reads of the configuration file (its teams and limits)."""

    @property
    def teams(self) -> Sequence[TeamConfig]:
        """The file's teams."""

    @property
    def backends(self) -> Sequence[_Served]:
        """The file's backends (their models may carry a budget)."""


@dataclass(frozen=True)
class Effective:
    """The entries in force, and which of them came from the store.

    Attributes:
        teams: every team, file order first, then the store's new ones.
        quotas: as for teams.
        budgets: as for teams.
        stored_teams: names of the teams whose weight the store gives.
        stored_limits: :func:`~fairq_server.store.entitlement.subject_of` of the store's
            quotas and budgets in force.

    """

    teams: tuple[TeamConfig, ...]
    quotas: tuple[QuotaConfig, ...]
    budgets: tuple[BudgetConfig, ...]
    stored_teams: frozenset[str]
    stored_limits: frozenset[tuple[str, str, str, str]]

    def team_source(self, team: TeamConfig) -> str:
        """Return ``store`` or ``file``."""
        return STORE if team.name in self.stored_teams else FILE

    def limit_source(self, entry: LimitEntry) -> str:
        """Return ``store`` or ``file``."""
        return STORE if subject_of(entry) in self.stored_limits else FILE

    def labels(self) -> list[str]:
        """Name each quota, then each budget, in messages: its place in the file, or ``store``.

        The file's entries keep their places in the merged lists (a stored entry overriding
        one takes its place; the store's others come after them).
        """
        quotas: list[LimitEntry] = list(self.quotas)
        budgets: list[LimitEntry] = list(self.budgets)
        return [
            "store" if self.limit_source(e) == STORE else f"{section}[{i}]"
            for section, entries in (("quotas", quotas), ("budgets", budgets))
            for i, e in enumerate(entries)
        ]


def check_team(team: TeamConfig) -> None:
    """Refuse a team the file would refuse, naming the field (``team.weight``).

    Raises:
        InvalidRequestError: the name or the weight is not usable.

    """
    try:
        check_name(team.name, "team.name", MAX_NAME_CHARS)
        check_teams([team], ())
    except ValueError as exc:
        raise InvalidRequestError(str(exc).replace("teams[0]", "team")) from None


def check_limit(
    entry: LimitEntry, teams: Iterable[str], prices: Mapping[str, object], served: set[str]
) -> None:
    """Refuse a quota or budget the file would refuse, naming the field (``quota.mode``).

    Args:
        entry: the quota or budget.
        teams: the teams in force (when there are any, a team's limit must name one).
        prices: the configured prices (a budget's model must have one).
        served: the models the backends serve.

    Raises:
        InvalidRequestError: naming the field at fault.

    """
    quota = isinstance(entry, QuotaConfig)
    try:
        check_entitlement(
            [entry] if isinstance(entry, QuotaConfig) else [],
            [entry] if isinstance(entry, BudgetConfig) else [],
            teams=teams, prices=prices, served=served,
        )  # fmt: skip
    except ValueError as exc:
        section = "quotas[0]" if quota else "budgets[0]"
        raise InvalidRequestError(str(exc).replace(section, limit_kind(entry))) from None


def effective(config: Config, stored: Stored, served: set[str]) -> Effective:
    """Merge ``stored`` into the file's entries (see the module's docstring for the rule)."""
    teams = {t.name: t for t in config.teams}
    stored_teams: set[str] = set()
    for team in stored.teams:
        try:
            check_team(team)
        except InvalidRequestError as exc:
            log.warning("stored team %r left out: %s", team.name[:64], exc)
            continue
        teams[team.name] = team
        stored_teams.add(team.name)
    file_entries: list[LimitEntry] = [*config.quotas, *config.budgets]
    limits = {subject_of(e): e for e in file_entries}
    stored_limits: set[tuple[str, str, str, str]] = set()
    stored_entries: list[LimitEntry] = [*stored.quotas, *stored.budgets]
    for entry in stored_entries:
        try:
            check_limit(entry, list(teams), config.prices, served)
        except InvalidRequestError as exc:
            log.warning("stored %s of %s left out: %s", limit_kind(entry), subject_of(entry), exc)
            continue
        limits[subject_of(entry)] = entry
        stored_limits.add(subject_of(entry))
    return Effective(
        tuple(teams.values()),
        tuple(e for e in limits.values() if isinstance(e, QuotaConfig)),
        tuple(e for e in limits.values() if isinstance(e, BudgetConfig)),
        frozenset(stored_teams),
        frozenset(stored_limits),
    )


def _models(config: Config) -> set[str]:
    return {m for b in config.backends for m in b.models}


def describe_limit(entry: LimitEntry) -> str:
    """Return a short description of ``entry``'s amounts and mode, for the audit log."""
    names: tuple[str, ...] = ("per_day", "per_month")
    if isinstance(entry, QuotaConfig):
        names = ("tokens_per_minute", "tokens_per_day", "requests_per_minute")
    amounts = [f"{n}={getattr(entry, n):g}" for n in names if getattr(entry, n) is not None]
    return ", ".join([*amounts, entry.mode])


def limit_target(kind: str, scope: str, subject: str, model: str) -> str:
    """Return how the audit log names a quota or budget (``quota team 'research' model *``)."""
    return f"{kind} {scope} {subject!r} model {model or '*'}"


class ManagedEntitlement:
    """Set and delete team weights, quotas and budgets; see the module's docstring.

    Args:
        stored: the store's entries (followed for other replicas' changes).
        audit: where each change is recorded.
        config: returns the configuration file in force (it changes at reload).
        served: returns the models the backends serve (the file's and registered ones).

    """

    def __init__(
        self,
        stored: StoredEntitlement,
        audit: AuditLog,
        config: Callable[[], Config],
        served: Callable[[], set[str]],
    ) -> None:
        self._stored = stored
        self._audit = audit
        self._config = config
        self._served = served

    def effective(self, config: Config | None = None) -> Effective:
        """Return the entries in force now (or with ``config`` as the file, at a reload)."""
        file = config if config is not None else self._config()
        return effective(file, self._stored.current, self._served() | _models(file))

    async def _record(self, who: str, via: str, action: str, target: str, detail: str) -> None:
        # The change is made by then: a failed audit write is logged, not turned into an error.
        try:
            await self._audit.record(who, via, action, target, detail)
        except Exception as exc:
            log.error("the audit log did not take %s %s by '%s': %s", action, target, who, exc)

    async def set_team(self, who: str, via: str, name: str, weight: float) -> TeamConfig:
        """Set team ``name``'s weight on every replica.

        Raises:
            InvalidRequestError: naming the field at fault.

        """
        team = TeamConfig(name, weight)
        check_team(team)
        await self._stored.set_team(team)
        await self._record(who, via, "team.set", name, f"weight {weight:g}")
        return team

    async def delete_team(self, who: str, via: str, name: str) -> bool:
        """Remove the stored weight of ``name`` (the file's applies again); False if none.

        Raises:
            InvalidRequestError: a stored quota or budget still names the team.

        """
        current = self.effective()
        if name in current.stored_teams and name not in {t.name for t in self._config().teams}:
            # Gone from the teams in force while others remain, a limit naming it would fail.
            remaining = [t for t in current.teams if t.name != name]
            entries: list[LimitEntry] = [*current.quotas, *current.budgets]
            naming = [e for e in entries if e.team == name]
            if remaining and naming:
                what = limit_target(*subject_of(naming[0]))
                raise InvalidRequestError(
                    f"team {name[:64]!r} is named by the {what}; delete it first"
                )
        if not await self._stored.delete_team(name):
            return False
        await self._record(who, via, "team.delete", name, "")
        return True

    async def set_limit(self, who: str, via: str, entry: LimitEntry) -> LimitEntry:
        """Set a quota or budget on every replica (replacing one of the same subject).

        Raises:
            InvalidRequestError: naming the field at fault.

        """
        config = self._config()
        teams = [t.name for t in self.effective().teams]
        check_limit(entry, teams, config.prices, self._served() | _models(config))
        await self._stored.set_limit(entry)
        target = limit_target(*subject_of(entry))
        await self._record(who, via, "limit.set", target, describe_limit(entry))
        return entry

    async def delete_limit(
        self, who: str, via: str, kind: str, scope: str, subject: str, model: str
    ) -> bool:
        """Remove a stored quota or budget (the file's applies again, if any); False if none.

        Raises:
            InvalidRequestError: ``kind`` or ``scope`` is not one of the known ones.

        """
        if kind not in ("quota", "budget"):
            raise InvalidRequestError(f"kind must be 'quota' or 'budget', not {kind[:32]!r}")
        if scope not in ("team", "user"):
            raise InvalidRequestError("give exactly one of team and user")
        if not await self._stored.delete_limit(kind, scope, subject, model):
            return False
        await self._record(who, via, "limit.delete", limit_target(kind, scope, subject, model), "")
        return True
