"""The Admin RPCs over team weights, quotas and budgets set live, and over the audit log.

Mixed into :class:`~fairq_server.doors.grpc.admin.AdminServicer`; they call
:class:`~fairq_server.tenancy.managed.ManagedEntitlement`, as the console's forms do, so a
change is checked by the configuration file's rules, stored, recorded in the audit log and in
force on every replica within one poll. Admin only; a fairq without a store answers
``FAILED_PRECONDITION``.
"""

from __future__ import annotations

import math

import grpc

from fairq.v1 import admin_pb2
from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.doors.grpc.admin_store import Context, StoreAdmin
from fairq_server.store.audit import ACTIONS
from fairq_server.store.entitlement import LimitEntry
from fairq_server.tenancy.managed import STORE, Effective, ManagedEntitlement

__all__ = ["EntitlementAdmin", "limit_message"]

_AUDIT_DEFAULT_ROWS = 100
_AUDIT_MAX_ROWS = 1000
_KINDS = {admin_pb2.LIMIT_KIND_QUOTA: "quota", admin_pb2.LIMIT_KIND_BUDGET: "budget"}


def _source(source: str) -> admin_pb2.EntrySource:
    return admin_pb2.ENTRY_SOURCE_STORE if source == STORE else admin_pb2.ENTRY_SOURCE_FILE


def limit_message(entry: LimitEntry, effective: Effective | None = None) -> admin_pb2.Limit:
    """Return the wire form of ``entry`` (with its source when ``effective`` is given)."""
    message = admin_pb2.Limit(team=entry.team, user=entry.user, model=entry.model, mode=entry.mode)
    if isinstance(entry, QuotaConfig):
        message.kind = admin_pb2.LIMIT_KIND_QUOTA
        message.tokens_per_minute = entry.tokens_per_minute or 0
        message.tokens_per_day = entry.tokens_per_day or 0
        message.requests_per_minute = entry.requests_per_minute or 0
    else:
        message.kind = admin_pb2.LIMIT_KIND_BUDGET
        message.per_day = entry.per_day or 0.0
        message.per_month = entry.per_month or 0.0
    if effective is not None:
        message.source = _source(effective.limit_source(entry))
    return message


def limit_entry(limit: admin_pb2.Limit) -> LimitEntry:
    """Return the entry a ``Limit`` message gives (checked later, by the file's rules).

    Raises:
        ValueError: the kind is missing, or amounts of the other kind are given.

    """
    kind = _KINDS.get(limit.kind)
    mode = limit.mode or "hard"
    if kind == "quota":
        if limit.per_day or limit.per_month:
            raise ValueError("limit.per_day and limit.per_month are for budgets, not quotas")
        return QuotaConfig(
            team=limit.team, user=limit.user, model=limit.model, mode=mode,
            tokens_per_minute=limit.tokens_per_minute or None,
            tokens_per_day=limit.tokens_per_day or None,
            requests_per_minute=limit.requests_per_minute or None,
        )  # fmt: skip
    if kind == "budget":
        if limit.tokens_per_minute or limit.tokens_per_day or limit.requests_per_minute:
            raise ValueError("limit.tokens_per_minute, tokens_per_day and requests_per_minute "
                             "are for quotas, not budgets")  # fmt: skip
        for name in ("per_day", "per_month"):
            if not math.isfinite(getattr(limit, name)):
                raise ValueError(f"budget.{name} must be a finite number above 0")
        return BudgetConfig(
            team=limit.team, user=limit.user, model=limit.model, mode=mode,
            per_day=limit.per_day or None, per_month=limit.per_month or None,
        )  # fmt: skip
    raise ValueError("limit.kind must be LIMIT_KIND_QUOTA or LIMIT_KIND_BUDGET")


class EntitlementAdmin(StoreAdmin):
    """Team, limit and audit RPCs; the servicer sets ``_managed`` (None without a store)."""

    _managed: ManagedEntitlement | None

    async def _need_managed(
        self, context: Context[object, object]
    ) -> tuple[ManagedEntitlement, str]:
        """Return the managed entries and the calling admin's identity."""
        _, who = await self._need_store(context)
        if self._managed is None:  # the store is still opening
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the store is not open yet")
        assert self._managed is not None
        return self._managed, who

    async def SetTeam(
        self, request: admin_pb2.SetTeamRequest, context: Context[object, object]
    ) -> admin_pb2.SetTeamResponse:
        """Store a team's weight."""
        managed, who = await self._need_managed(context)
        name, weight = request.team.name, request.team.weight
        team = await self._store_call(context, managed.set_team(who, "admin-api", name, weight))
        return admin_pb2.SetTeamResponse(
            team=admin_pb2.Team(
                name=team.name, weight=team.weight, source=admin_pb2.ENTRY_SOURCE_STORE
            )
        )

    async def DeleteTeam(
        self, request: admin_pb2.DeleteTeamRequest, context: Context[object, object]
    ) -> admin_pb2.DeleteTeamResponse:
        """Remove a stored team."""
        managed, who = await self._need_managed(context)
        if not await self._store_call(context, managed.delete_team(who, "admin-api", request.name)):
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"the store has no team {request.name[:64]!r}"
            )
        return admin_pb2.DeleteTeamResponse()

    async def ListTeams(
        self, request: admin_pb2.ListTeamsRequest, context: Context[object, object]
    ) -> admin_pb2.ListTeamsResponse:
        """List the teams in force."""
        managed, _ = await self._need_managed(context)
        effective = managed.effective()
        return admin_pb2.ListTeamsResponse(
            teams=[
                admin_pb2.Team(
                    name=t.name, weight=t.weight, source=_source(effective.team_source(t))
                )
                for t in effective.teams
            ]
        )

    async def SetLimit(
        self, request: admin_pb2.SetLimitRequest, context: Context[object, object]
    ) -> admin_pb2.SetLimitResponse:
        """Store a quota or a budget."""
        managed, who = await self._need_managed(context)
        try:
            entry = limit_entry(request.limit)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        stored = await self._store_call(context, managed.set_limit(who, "admin-api", entry))
        message = limit_message(stored)
        message.source = admin_pb2.ENTRY_SOURCE_STORE
        return admin_pb2.SetLimitResponse(limit=message)

    async def DeleteLimit(
        self, request: admin_pb2.DeleteLimitRequest, context: Context[object, object]
    ) -> admin_pb2.DeleteLimitResponse:
        """Remove a stored quota or budget."""
        managed, who = await self._need_managed(context)
        kind = _KINDS.get(request.kind)
        if kind is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "kind must be LIMIT_KIND_QUOTA or LIMIT_KIND_BUDGET",
            )
        assert kind is not None
        if bool(request.team) == bool(request.user):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "give exactly one of team and user"
            )
        scope, subject = ("team", request.team) if request.team else ("user", request.user)
        call = managed.delete_limit(who, "admin-api", kind, scope, subject, request.model)
        if not await self._store_call(context, call):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"the store has no {kind} of {scope} {subject[:64]!r}"
                + (f" for model {request.model[:64]!r}" if request.model else ""),
            )
        return admin_pb2.DeleteLimitResponse()

    async def ListLimits(
        self, request: admin_pb2.ListLimitsRequest, context: Context[object, object]
    ) -> admin_pb2.ListLimitsResponse:
        """List the quotas and budgets in force."""
        managed, _ = await self._need_managed(context)
        effective = managed.effective()
        entries: list[LimitEntry] = [*effective.quotas, *effective.budgets]
        return admin_pb2.ListLimitsResponse(limits=[limit_message(e, effective) for e in entries])

    async def ListAuditLog(
        self, request: admin_pb2.ListAuditLogRequest, context: Context[object, object]
    ) -> admin_pb2.ListAuditLogResponse:
        """Return the newest recorded changes."""
        store, _ = await self._need_store(context)
        if request.limit > _AUDIT_MAX_ROWS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"limit must be at most {_AUDIT_MAX_ROWS}"
            )
        if request.action and request.action not in ACTIONS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"action must be one of {', '.join(ACTIONS)} (or empty)",
            )
        rows = await self._store_call(
            context, store.audit.recent(request.limit or _AUDIT_DEFAULT_ROWS, request.action)
        )
        return admin_pb2.ListAuditLogResponse(
            entries=[
                admin_pb2.AuditEntry(
                    at_unix_seconds=a.at,
                    actor=a.actor,
                    via=a.via,
                    action=a.action,
                    target=a.target,
                    detail=a.detail,
                    replica=a.replica,
                )
                for a in rows
            ]
        )
