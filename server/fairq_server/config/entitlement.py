"""The ``[[quotas]]`` and ``[[budgets]]`` tables: how much a team or a user may use over time.

Example::

    [[quotas]]
    team = "research"              # or user = "alice"; user = "*": every user without its own
    model = "llama-70b"            # optional: this model only (default: all models together)
    tokens_per_minute = 50000      # rolling 60 s, input plus output tokens
    tokens_per_day = 2000000       # calendar day, UTC
    requests_per_minute = 120      # rolling 60 s
    mode = "soft"                  # "hard" (default): refused; "soft": served when idle only

    [[budgets]]
    user = "alice"
    per_day = 5.0                  # in the units of [prices.<model>], calendar day UTC
    per_month = 100.0              # calendar month, UTC
    mode = "hard"

Each entry names exactly one of ``team`` and ``user``; names are verbatim (any unicode, up to
256 characters). ``user = "*"`` gives every user a counter of its own with these limits, unless
an entry names that user for the same model. Two entries for the same subject and model are
refused (which one holds would be a guess); put every limit of one subject in one entry.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Float, Int, Str, doc, section
from fairq_server.names import MAX_NAME_CHARS, check_name

__all__ = [
    "ANY_USER",
    "BudgetConfig",
    "EntitlementError",
    "QuotaConfig",
    "check_entitlement",
]

#: ``user = "*"``: the limits every user gets without an entry of its own.
ANY_USER = "*"
_MODES = ("hard", "soft")


class EntitlementError(ValueError):
    """A ``[[quotas]]`` or ``[[budgets]]`` entry is not usable; the message names it."""


_SUBJECT_HELP = {
    "team": "the team limited (all its users together); empty: ``user`` is",
    "user": "the user limited (``*``: each user without an entry of its own); empty: ``team`` is",
    "mode": (
        "``hard`` (refused when reached) or ``soft`` (served only when no in-quota request of "
        "the same tier waits for the model)"
    ),
}


@section
@dataclass(frozen=True)
class QuotaConfig:
    """Token and request limits of one team or user (``[[quotas]]``)."""

    team: Annotated[Str, doc(_SUBJECT_HELP["team"])] = ""
    user: Annotated[Str, doc(_SUBJECT_HELP["user"])] = ""
    model: Annotated[Str, doc("the model counted (empty: every model together)")] = ""
    tokens_per_minute: Annotated[
        Int | None, doc("input plus output tokens in any rolling 60 seconds", gt=0)
    ] = None
    tokens_per_day: Annotated[
        Int | None, doc("input plus output tokens per calendar day (UTC)", gt=0)
    ] = None
    requests_per_minute: Annotated[
        Int | None, doc("requests dispatched in any rolling 60 seconds", gt=0)
    ] = None
    mode: Annotated[Str, doc(_SUBJECT_HELP["mode"])] = "hard"


@section
@dataclass(frozen=True)
class BudgetConfig:
    """Cost limits of one team or user (``[[budgets]]``), in the units of ``[prices]``."""

    team: Annotated[Str, doc(_SUBJECT_HELP["team"])] = ""
    user: Annotated[Str, doc(_SUBJECT_HELP["user"])] = ""
    model: Annotated[Str, doc("the model counted (empty: every priced model together)")] = ""
    per_day: Annotated[Float | None, doc("cost per calendar day (UTC)", gt=0)] = None
    per_month: Annotated[Float | None, doc("cost per calendar month (UTC)", gt=0)] = None
    mode: Annotated[Str, doc(_SUBJECT_HELP["mode"])] = "hard"


_QUOTA_LIMITS = ("tokens_per_minute", "tokens_per_day", "requests_per_minute")
_BUDGET_LIMITS = ("per_day", "per_month")


def check_entitlement(
    quotas: Sequence[QuotaConfig],
    budgets: Sequence[BudgetConfig],
    *,
    teams: Iterable[str],
    prices: Mapping[str, object],
    served: set[str],
) -> None:
    """Refuse unusable quota and budget entries (called at start and at every reload).

    Args:
        quotas: the ``[[quotas]]`` entries.
        budgets: the ``[[budgets]]`` entries.
        teams: the configured teams (empty: any team name is accepted).
        prices: the ``[prices.<model>]`` tables.
        served: the models the configured backends serve.

    Raises:
        EntitlementError: naming the entry and key at fault.

    """
    known = set(teams)
    sections: tuple[tuple[str, Sequence[QuotaConfig | BudgetConfig], tuple[str, ...]], ...] = (
        ("quotas", quotas, _QUOTA_LIMITS),
        ("budgets", budgets, _BUDGET_LIMITS),
    )
    for table, entries, limits in sections:
        seen: dict[tuple[str, str, str], int] = {}
        for i, entry in enumerate(entries):
            what = f"{table}[{i}]"
            subject = _check_subject(entry, what, known)
            _check_limits(entry, what, limits)
            if entry.mode not in _MODES:
                raise EntitlementError(f"{what}.mode must be 'hard' or 'soft', not {entry.mode!r}")
            if entry.model:
                check_name(entry.model, f"{what}.model", MAX_NAME_CHARS)
            if table == "budgets":
                _check_priced(entry.model, what, prices, served)
            key = (*subject, entry.model)
            if key in seen:
                raise EntitlementError(
                    f"{what}: {subject[0]} {subject[1]!r}"
                    + (f" model {entry.model!r}" if entry.model else "")
                    + f" already has an entry ({table}[{seen[key]}]); put its limits in one"
                )
            seen[key] = i


def _check_subject(
    entry: QuotaConfig | BudgetConfig, what: str, teams: set[str]
) -> tuple[str, str]:
    if bool(entry.team) == bool(entry.user):
        raise EntitlementError(f"{what}: give exactly one of team and user")
    try:
        if entry.team:
            check_name(entry.team, f"{what}.team", MAX_NAME_CHARS)
        elif entry.user != ANY_USER:
            check_name(entry.user, f"{what}.user", MAX_NAME_CHARS)
    except ValueError as exc:
        raise EntitlementError(str(exc)) from None
    if entry.team and teams and entry.team not in teams:
        raise EntitlementError(
            f"{what}.team: team {entry.team!r} is not configured in [[teams]] "
            f"(configured: {', '.join(sorted(map(repr, teams)))})"
        )
    return ("team", entry.team) if entry.team else ("user", entry.user)


def _check_limits(entry: QuotaConfig | BudgetConfig, what: str, names: tuple[str, ...]) -> None:
    given = 0
    for name in names:
        value = getattr(entry, name)
        if value is None:
            continue
        given += 1
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:
            raise EntitlementError(f"{what}.{name} must be a finite number above 0, not {value!r}")
    if not given:
        raise EntitlementError(f"{what}: no limit given (one or more of {', '.join(names)})")


def _check_priced(model: str, what: str, prices: Mapping[str, object], served: set[str]) -> None:
    if not model:
        if not prices:
            raise EntitlementError(
                f"{what}: a budget counts cost, and no [prices.<model>] table is configured"
            )
        return
    if model not in served:
        raise EntitlementError(
            f"{what}.model: no configured backend serves model {model!r} (served: {sorted(served)})"
        )
    if model not in prices:
        raise EntitlementError(
            f"{what}.model: model {model!r} has no [prices.{model}] table, so its cost is unknown"
        )
