"""The queue view's quotas and budgets: each waiting user's limits, and every team's.

Read here into the figures ``templates/queues.html`` writes, from the views' ``limits`` (per
user row) and ``teams`` (per replica) fields (see :mod:`fairq_server.tenancy.standing`),
read defensively like the rest of the views. A limit's state is said in words ("over quota —
idle-only band", "at limit — refused until …", "near limit") and carried in a ``data-state``
attribute; the colour only repeats it. In a cluster each replica reports the use its book
last saw, so a team's row shows the highest.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

__all__ = ["limits_of", "team_of", "team_rows"]

View = dict[str, Any]


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _limits(value: object) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list | tuple) else []


def _amount(value: float) -> str:
    """Write whole numbers plainly, costs to four significant digits."""
    return str(int(value)) if value == int(value) else f"{value:.4g}"


def _when(epoch: float) -> str:
    """Write a moment for a person, in UTC (the date too: a budget's month may end days away)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _what(lim: dict[str, Any]) -> str:
    return "budget" if str(lim.get("kind", "")).startswith("budget_") else "quota"


def _state_text(lim: dict[str, Any]) -> str:
    """Return the limit's state in words (empty: well within it)."""
    state = lim.get("state")
    if state == "over":
        if lim.get("mode") == "hard":
            until = lim.get("until")
            when = _when(_num(until)) if until is not None else "its window ends"
            return f"at limit — refused until {when}"
        return f"over {_what(lim)} — idle-only band"
    if state == "warn":
        return "near limit (80 % or more)"
    return ""


def _limit(lim: dict[str, Any]) -> SimpleNamespace:
    """Return one limit as a user row's cell writes it."""
    used, limit = _num(lim.get("used")), _num(lim.get("limit"))
    return SimpleNamespace(
        scope=lim.get("scope", ""),
        subject=lim.get("subject", ""),
        kind=lim.get("kind", ""),
        mode=lim.get("mode", ""),
        model=lim.get("model") or "",
        amounts=f"{_amount(used)} / {_amount(limit)}"
        + (f" ({used / limit:.0%})" if limit > 0 else ""),
        state=lim.get("state"),
        state_text=_state_text(lim),
    )


def limits_of(row: dict[str, Any]) -> list[SimpleNamespace]:
    """Return the limits that hold for a user row, each with its use and state in words."""
    return [_limit(lim) for lim in _limits(row.get("limits"))]


def team_of(row: dict[str, Any]) -> SimpleNamespace | None:
    """Return a user row's team, its weight, and what it is over (None: no team)."""
    team = str(row.get("team", "") or "")
    if not team:
        return None
    over = [
        lim
        for lim in _limits(row.get("limits"))
        if lim.get("scope") == "team" and lim.get("state") == "over"
    ]
    words = ""
    if over:
        words = "team at limit" if any(lim.get("mode") == "hard" for lim in over) else (
            f"team over {_what(over[0])}"
        )  # fmt: skip
    return SimpleNamespace(name=team, weight=f"{_num(row.get('team_weight')):g}", over=words)


def _merged_teams(views: list[View]) -> dict[str, tuple[float, dict[tuple[str, ...], View]]]:
    """Return each team's weight and limits over every replica (the highest use of each)."""
    teams: dict[str, tuple[float, dict[tuple[str, ...], View]]] = {}
    for v in views:
        for t in _limits(v.get("teams")):
            name = str(t.get("team", ""))
            _, limits = teams.setdefault(name, (_num(t.get("weight")), {}))
            for lim in _limits(t.get("limits")):
                key = tuple(str(lim.get(f, "")) for f in ("kind", "model", "mode"))
                seen = limits.get(key)
                if seen is None or _num(lim.get("used")) > _num(seen.get("used")):
                    limits[key] = lim
    return teams


def team_rows(views: list[View]) -> list[SimpleNamespace]:
    """Return a row per team and configured quota or budget (none: no team has one)."""
    rows = []
    for name, (weight, limits) in sorted(_merged_teams(views).items()):
        for key, lim in sorted(limits.items()):
            used, limit = _num(lim.get("used")), _num(lim.get("limit"))
            rows.append(
                SimpleNamespace(
                    team=name,
                    weight=f"{weight:g}",
                    limit=f"{key[0]} ({key[2]}, {lim.get('model') or 'every model'})",
                    amounts=f"{_amount(used)} / {_amount(limit)}"
                    + (f" ({used / limit:.0%})" if limit > 0 else ""),
                    state=str(lim.get("state") or "ok"),
                    words=_state_text(lim) or "within",
                )
            )
    return rows
