"""The audit log: every change an admin makes through the console or the Admin API.

One row per change (a key created, rotated or revoked, a backend registered or removed, a
team's weight, a quota or a budget set or deleted) or
console login, naming the admin's identity, the way it came (``console`` or ``admin-api``),
the action, its target and a short detail. Rows are written when the change has been made
(so a change the store refused leaves none), read newest first, and bounded: each write
deletes the rows older than ``store.audit_retention_days`` and the oldest beyond
``store.audit_max_rows``. Changes are rare, so the write and its pruning cost nothing a
request would notice.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.store.schema import audit_log

__all__ = ["ACTIONS", "AuditEntry", "AuditLog"]

log = logging.getLogger(__name__)

# The actions recorded, for the console's filter and the documentation.
ACTIONS = (
    "console.login",
    "key.create",
    "key.rotate",
    "key.revoke",
    "backend.register",
    "backend.deregister",
    "team.set",
    "team.delete",
    "limit.set",
    "limit.delete",
)
# Longest target and detail kept (a name or a URL given by a caller is bounded here).
_MAX_TEXT = 500


@dataclass(frozen=True)
class AuditEntry:
    """One recorded change.

    Attributes:
        at: Unix time it was made.
        actor: the admin's identity (its key's user, or the identity token's subject).
        via: ``console`` or ``admin-api``.
        action: one of :data:`ACTIONS`.
        target: what it changed (a key id, a backend id).
        detail: more about it (the key's user, the new key's id, the backend's URL).
        replica: the replica that made it.

    """

    at: float
    actor: str
    via: str
    action: str
    target: str
    detail: str
    replica: str


class AuditLog:
    """The ``audit_log`` table on ``engine``.

    Args:
        engine: the store's engine.
        replica: this process's name, stored with each row.
        retention_seconds: rows older than this are deleted.
        max_rows: at most this many rows are kept (the oldest deleted first).

    """

    def __init__(
        self, engine: AsyncEngine, replica: str, retention_seconds: float, max_rows: int
    ) -> None:
        self._engine = engine
        self._replica = replica
        self._retention = retention_seconds
        self._max_rows = max_rows

    async def record(
        self, actor: str, via: str, action: str, target: str, detail: str = ""
    ) -> AuditEntry:
        """Write one row (and prune the old ones); return it.

        Raises:
            ValueError: ``action`` is not one of :data:`ACTIONS`.

        """
        if action not in ACTIONS:
            raise ValueError(f"unknown audit action {action[:64]!r}")
        entry = AuditEntry(
            time.time(), actor[:_MAX_TEXT], via[:32], action,
            target[:_MAX_TEXT], detail[:_MAX_TEXT], self._replica[:_MAX_TEXT],
        )  # fmt: skip
        async with self._engine.begin() as conn:
            await conn.execute(
                audit_log.insert().values(
                    id=uuid.uuid4().hex,
                    at=datetime.fromtimestamp(entry.at, UTC),
                    actor=entry.actor,
                    via=entry.via,
                    action=entry.action,
                    target=entry.target,
                    detail=entry.detail,
                    replica=entry.replica,
                )
            )
            await conn.execute(
                delete(audit_log).where(
                    audit_log.c.at < datetime.fromtimestamp(entry.at - self._retention, UTC)
                )
            )
            # The newest max_rows rows stay: delete what is older than the oldest of them.
            oldest_kept = (
                select(audit_log.c.at)
                .order_by(audit_log.c.at.desc())
                .offset(self._max_rows - 1)
                .limit(1)
                .scalar_subquery()
            )
            await conn.execute(delete(audit_log).where(audit_log.c.at < oldest_kept))
        log.info(
            "audit: '%s' (%s) %s %s %s", entry.actor, entry.via, entry.action, entry.target,
            entry.detail,
        )  # fmt: skip
        return entry

    async def recent(self, limit: int = 200, action: str = "") -> list[AuditEntry]:
        """Return the newest ``limit`` rows (of ``action`` only, if given), newest first."""
        query = select(audit_log).order_by(audit_log.c.at.desc(), audit_log.c.id).limit(limit)
        if action:
            query = query.where(audit_log.c.action == action)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [
            AuditEntry(_unix(r.at), r.actor, r.via, r.action, r.target, r.detail, r.replica)
            for r in rows
        ]


def _unix(value: datetime) -> float:
    # SQLite hands the stored UTC time back without its zone.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
