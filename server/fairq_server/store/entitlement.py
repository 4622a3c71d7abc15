"""Team weights, quotas and budgets in the store: set over the Admin API, read by every replica.

The rows are written by :class:`~fairq_server.tenancy.managed.ManagedEntitlement` (which
checks them first) and read here as the configuration file's own entries
(:class:`~fairq_server.tenancy.teams.TeamConfig`, :class:`QuotaConfig`, :class:`BudgetConfig`). Each
replica keeps what it read in memory and, like the key store, learns every
``key_poll_seconds`` whether the ``tenancy`` counter of ``store_versions`` moved (one
query reads both counters: :mod:`~fairq_server.store.versions`); every change raises it in
its own transaction. When it moved, the rows are
read again and ``on_change`` is called, so a weight or a limit set on one replica holds on
every replica within one poll. While the store cannot be read, the entries read last stay in
force (logged at most every 10 s).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.store.schema import ENTITLEMENT_VERSION, entitlement_limits, store_versions, teams

__all__ = ["LimitEntry", "Stored", "StoredEntitlement", "limit_kind", "subject_of"]

log = logging.getLogger(__name__)


#: A quota or a budget, as the configuration file's tables give them.
LimitEntry = QuotaConfig | BudgetConfig


def limit_kind(entry: LimitEntry) -> str:
    """Return ``quota`` or ``budget``."""
    return "quota" if isinstance(entry, QuotaConfig) else "budget"


def subject_of(entry: LimitEntry) -> tuple[str, str, str, str]:
    """Return what identifies ``entry``: ``(kind, scope, name, model)``.

    Two entries with the same subject cannot both hold; a stored one overrides the file's.
    """
    scope, name = ("team", entry.team) if entry.team else ("user", entry.user)
    return limit_kind(entry), scope, name, entry.model


@dataclass(frozen=True)
class Stored:
    """The entries the store holds (each replica's copy of them)."""

    teams: tuple[TeamConfig, ...] = ()
    quotas: tuple[QuotaConfig, ...] = ()
    budgets: tuple[BudgetConfig, ...] = ()


class StoredEntitlement:
    """The ``teams`` and ``entitlement_limits`` tables, followed for changes by any replica.

    Args:
        engine: the store's engine (its schema current).
        poll_seconds: how often to check for changes.

    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._version: int | None = None
        self.current = Stored()
        self.on_change: Callable[[Stored], None] = lambda stored: None

    @property
    def version(self) -> int | None:
        """The entries' version counter at the last read (a ``Follower`` of the store's poll)."""
        return self._version

    async def refresh(self) -> bool:
        """Read the entries again if their version moved (then tell ``on_change``)."""
        async with self._engine.connect() as conn:
            version = await _version(conn)
            if version == self._version:
                return False
            team_rows = (await conn.execute(select(teams).order_by(teams.c.name))).all()
            order = (entitlement_limits.c.kind, entitlement_limits.c.scope,
                     entitlement_limits.c.subject, entitlement_limits.c.model)  # fmt: skip
            limit_rows = (await conn.execute(select(entitlement_limits).order_by(*order))).all()
        stored = Stored(
            tuple(TeamConfig(r.name, float(r.weight)) for r in team_rows),
            tuple(_quota(r) for r in limit_rows if r.kind == "quota"),
            tuple(_budget(r) for r in limit_rows if r.kind == "budget"),
        )
        self.current, self._version = stored, version
        self.on_change(stored)
        return True

    def unreadable(self, error: str) -> None:
        """Log that the store could not be read (the entries read last stay in force)."""
        log.warning(
            "entitlement store unreadable, keeping the teams, quotas and budgets "
            "read last: %s", error,
        )  # fmt: skip

    # -- changes (checked by the caller) --------------------------------------------------

    async def set_team(self, team: TeamConfig) -> None:
        """Store ``team``'s weight (replacing a stored one of the same name)."""
        async with self._engine.begin() as conn:
            await conn.execute(delete(teams).where(teams.c.name == team.name))
            await conn.execute(
                teams.insert().values(name=team.name, weight=team.weight, updated_at=_now())
            )
            await _bump(conn)
        await self._refresh_quietly()

    async def delete_team(self, name: str) -> bool:
        """Remove the stored team ``name``; False when there is none."""
        async with self._engine.begin() as conn:
            gone = (await conn.execute(delete(teams).where(teams.c.name == name))).rowcount
            if gone:
                await _bump(conn)
        await self._refresh_quietly()
        return bool(gone)

    async def set_limit(self, entry: LimitEntry) -> None:
        """Store ``entry`` (replacing a stored one of the same subject)."""
        kind, scope, subject, model = subject_of(entry)
        values: dict[str, Any] = {
            "kind": kind, "scope": scope, "subject": subject, "model": model,
            "mode": entry.mode, "updated_at": _now(),
        }  # fmt: skip
        if isinstance(entry, QuotaConfig):
            values |= {"tokens_per_minute": entry.tokens_per_minute,
                       "tokens_per_day": entry.tokens_per_day,
                       "requests_per_minute": entry.requests_per_minute}  # fmt: skip
        else:
            values |= {"per_day": entry.per_day, "per_month": entry.per_month}
        async with self._engine.begin() as conn:
            await conn.execute(_where(delete(entitlement_limits), kind, scope, subject, model))
            await conn.execute(entitlement_limits.insert().values(**values))
            await _bump(conn)
        await self._refresh_quietly()

    async def delete_limit(self, kind: str, scope: str, subject: str, model: str) -> bool:
        """Remove the stored quota or budget of that subject; False when there is none."""
        async with self._engine.begin() as conn:
            statement = _where(delete(entitlement_limits), kind, scope, subject, model)
            gone = (await conn.execute(statement)).rowcount
            if gone:
                await _bump(conn)
        await self._refresh_quietly()
        return bool(gone)

    async def _refresh_quietly(self) -> None:
        """Apply a change made here at once; if the read fails, the next poll does it."""
        with contextlib.suppress(Exception):
            await self.refresh()


def _where(statement: Any, kind: str, scope: str, subject: str, model: str) -> Any:
    c = entitlement_limits.c
    return statement.where(c.kind == kind, c.scope == scope, c.subject == subject, c.model == model)


def _quota(row: Any) -> QuotaConfig:
    team, user = (row.subject, "") if row.scope == "team" else ("", row.subject)
    return QuotaConfig(
        team=team, user=user, model=row.model, tokens_per_minute=row.tokens_per_minute,
        tokens_per_day=row.tokens_per_day, requests_per_minute=row.requests_per_minute,
        mode=row.mode,
    )  # fmt: skip


def _budget(row: Any) -> BudgetConfig:
    team, user = (row.subject, "") if row.scope == "team" else ("", row.subject)
    return BudgetConfig(team=team, user=user, model=row.model, per_day=row.per_day,
                        per_month=row.per_month, mode=row.mode)  # fmt: skip


def _now() -> datetime:
    return datetime.now(UTC)


async def _version(conn: AsyncConnection) -> int:
    query = select(store_versions.c.version).where(store_versions.c.name == ENTITLEMENT_VERSION)
    return int((await conn.execute(query)).scalar_one())


async def _bump(conn: AsyncConnection) -> None:
    await conn.execute(
        update(store_versions).where(store_versions.c.name == ENTITLEMENT_VERSION)
        .values(version=store_versions.c.version + 1)
    )  # fmt: skip
