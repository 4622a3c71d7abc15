"""Team weights, quotas, budgets and the audit log over the ``Admin`` service (admin only).

A fairq with a store keeps what these calls set, checks it by its configuration file's rules
(bad input raises :class:`~fairq.InvalidArgumentError` naming the field), records every change
in its audit log, and applies it on every replica sharing the store within a poll. A stored
entry overrides the configuration file's entry of the same subject; deleting it brings the
file's back. Without a store the calls raise :class:`~fairq.FairqError` (FAILED_PRECONDITION).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fairq._calls import UnaryCall
from fairq.v1 import admin_pb2

__all__ = ["AuditEntry", "Limit", "Team"]

_SOURCES = {admin_pb2.ENTRY_SOURCE_FILE: "file", admin_pb2.ENTRY_SOURCE_STORE: "store"}
_KINDS = {"quota": admin_pb2.LIMIT_KIND_QUOTA, "budget": admin_pb2.LIMIT_KIND_BUDGET}


@dataclass(frozen=True, slots=True)
class Team:
    """A team's weight in force.

    Attributes:
        name: The team, as keys and tokens name it.
        weight: Service owed against the other teams (2: twice a team of 1).
        source: ``"file"`` (the configuration file) or ``"store"``.

    """

    name: str
    weight: float
    source: str = "store"


@dataclass(frozen=True, slots=True)
class Limit:
    """A quota (tokens, requests) or a budget (cost) of one team or user.

    Give exactly one of ``team`` and ``user`` (``user="*"``: every user without its own) and at
    least one amount of the kind; amounts left at 0 do not limit.

    Attributes:
        kind: ``"quota"`` or ``"budget"``.
        team: The team limited (all its users together).
        user: The user limited.
        model: The model counted; empty: every model together.
        tokens_per_minute: Quotas: tokens in any rolling minute.
        tokens_per_day: Quotas: tokens per UTC day.
        requests_per_minute: Quotas: requests in any rolling minute.
        per_day: Budgets: cost per UTC day, in the units of fairq's prices.
        per_month: Budgets: cost per UTC month.
        mode: ``"hard"`` (refused when reached) or ``"soft"`` (served when idle only).
        source: In answers, ``"file"`` or ``"store"``.

    """

    kind: Literal["quota", "budget"]
    team: str = ""
    user: str = ""
    model: str = ""
    tokens_per_minute: int = 0
    tokens_per_day: int = 0
    requests_per_minute: int = 0
    per_day: float = 0.0
    per_month: float = 0.0
    mode: str = "hard"
    source: str = ""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change an admin made (a key, a backend, a team, a limit, a console login).

    Attributes:
        at: Unix time it was made.
        actor: The admin's identity.
        via: ``"admin-api"`` or ``"console"``.
        action: E.g. ``"team.set"``, ``"limit.delete"``, ``"key.revoke"``.
        target: What it changed.
        detail: More about it.
        replica: The fairq replica that made it.

    """

    at: float
    actor: str
    via: str
    action: str
    target: str
    detail: str
    replica: str


def _team(message: admin_pb2.Team) -> Team:
    return Team(message.name, message.weight, _SOURCES.get(message.source, ""))


def _limit(m: admin_pb2.Limit) -> Limit:
    return Limit(
        kind="quota" if m.kind == admin_pb2.LIMIT_KIND_QUOTA else "budget",
        team=m.team, user=m.user, model=m.model, tokens_per_minute=m.tokens_per_minute,
        tokens_per_day=m.tokens_per_day, requests_per_minute=m.requests_per_minute,
        per_day=m.per_day, per_month=m.per_month, mode=m.mode,
        source=_SOURCES.get(m.source, ""),
    )  # fmt: skip


def _kind(kind: str) -> admin_pb2.LimitKind:
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'quota' or 'budget', not {kind!r}")
    return _KINDS[kind]


def set_team(name: str, weight: float, *, timeout: float | None = None) -> UnaryCall[Team]:
    """Set a team's weight on every replica (overrides the file's team of that name).

    Raises:
        InvalidArgumentError: The name or the weight is not usable (named).
        FairqError: The call failed.

    """
    request = admin_pb2.SetTeamRequest(team=admin_pb2.Team(name=name, weight=weight))
    return UnaryCall("SetTeam", request, lambda r: _team(r.team), timeout)


def delete_team(name: str, *, timeout: float | None = None) -> UnaryCall[None]:
    """Remove a stored team weight (the file's applies again).

    Raises:
        NotFoundError: The store has no such team.
        FairqError: The call failed.

    """
    return UnaryCall("DeleteTeam", admin_pb2.DeleteTeamRequest(name=name), lambda r: None, timeout)


def list_teams(*, timeout: float | None = None) -> UnaryCall[list[Team]]:
    """Return the teams in force, the file's and the store's.

    Raises:
        FairqError: The call failed.

    """
    return UnaryCall(
        "ListTeams", admin_pb2.ListTeamsRequest(), lambda r: [_team(t) for t in r.teams], timeout
    )


def set_limit(limit: Limit, *, timeout: float | None = None) -> UnaryCall[Limit]:
    """Set a quota or budget on every replica (overrides the file's of the same subject).

    Raises:
        ValueError: ``limit.kind`` is not ``quota`` or ``budget``.
        InvalidArgumentError: The entry is not usable (the field is named).
        FairqError: The call failed.

    """
    message = admin_pb2.Limit(
        kind=_kind(limit.kind), team=limit.team, user=limit.user, model=limit.model,
        tokens_per_minute=limit.tokens_per_minute, tokens_per_day=limit.tokens_per_day,
        requests_per_minute=limit.requests_per_minute, per_day=limit.per_day,
        per_month=limit.per_month, mode=limit.mode,
    )  # fmt: skip
    request = admin_pb2.SetLimitRequest(limit=message)
    return UnaryCall("SetLimit", request, lambda r: _limit(r.limit), timeout)


def delete_limit(
    kind: Literal["quota", "budget"],
    *,
    team: str = "",
    user: str = "",
    model: str = "",
    timeout: float | None = None,
) -> UnaryCall[None]:
    """Remove a stored quota or budget (the file's applies again, if it has one).

    Raises:
        ValueError: ``kind`` is not ``quota`` or ``budget``.
        NotFoundError: The store has no such entry.
        FairqError: The call failed.

    """
    request = admin_pb2.DeleteLimitRequest(kind=_kind(kind), team=team, user=user, model=model)
    return UnaryCall("DeleteLimit", request, lambda r: None, timeout)


def list_limits(*, timeout: float | None = None) -> UnaryCall[list[Limit]]:
    """Return the quotas and budgets in force, the file's and the store's.

    Raises:
        FairqError: The call failed.

    """
    request = admin_pb2.ListLimitsRequest()
    return UnaryCall("ListLimits", request, lambda r: [_limit(x) for x in r.limits], timeout)


def audit_log(
    *, limit: int = 0, action: str = "", timeout: float | None = None
) -> UnaryCall[list[AuditEntry]]:
    """Return the newest recorded changes, newest first.

    Args:
        limit: Rows (0: the server's default, 100; at most 1000).
        action: Only this action (e.g. ``"limit.set"``); empty: all.
        timeout: Deadline for the call in seconds.

    Raises:
        ValueError: ``limit`` is negative.
        FairqError: The call failed.

    """
    if limit < 0:
        raise ValueError("limit must be 0 or more")
    request = admin_pb2.ListAuditLogRequest(limit=limit, action=action)
    return UnaryCall(
        "ListAuditLog",
        request,
        lambda r: [
            AuditEntry(e.at_unix_seconds, e.actor, e.via, e.action, e.target, e.detail, e.replica)
            for e in r.entries
        ],
        timeout,
    )
