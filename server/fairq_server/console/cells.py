"""The queue view's quotas and budgets: each waiting user's limits, and every team's.

Rendered from the views' ``limits`` (per user row) and ``teams`` (per replica) fields (see
:mod:`fairq_server.tenancy.standing`), read defensively like the rest of the views. A limit's
state is said in words ("over quota — idle-only band", "at limit — refused until …", "near
limit") and carried in a ``data-state`` attribute; the colour only repeats it. In a cluster
each replica reports the use its book last saw, so a team's row shows the highest.
"""

from __future__ import annotations

import time
from typing import Any

from fairq_server.console.text import esc as _e

__all__ = ["limits_cell", "team_cell", "teams_section"]

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


def _describe(lim: dict[str, Any]) -> str:
    used, limit = _num(lim.get("used")), _num(lim.get("limit"))
    ratio = f" ({used / limit:.0%})" if limit > 0 else ""
    model = f", model {_e(lim.get('model'))}" if lim.get("model") else ""
    text = (
        f"{_e(lim.get('scope', ''))} {_e(lim.get('subject', ''))}: {_e(lim.get('kind', ''))} "
        f"({_e(lim.get('mode', ''))}{model}) {_amount(used)} / {_amount(limit)}{ratio}"
    )
    state = _state_text(lim)
    if state:
        text += f' — <strong class="badge {_e(lim.get("state"))}">{_e(state)}</strong>'
    return text


def limits_cell(row: dict[str, Any]) -> str:
    """Return a user row's limits cell: each limit that holds for it, its use and state."""
    lims = _limits(row.get("limits"))
    if not lims:
        return "—"
    items = "".join(
        f'<li data-scope="{_e(lim.get("scope", ""))}" data-state="{_e(lim.get("state") or "ok")}">'
        f"{_describe(lim)}</li>"
        for lim in lims
    )
    return f'<ul class="limits">{items}</ul>'


def team_cell(row: dict[str, Any]) -> str:
    """Return a user row's team cell: the team, its weight, and a mark if it is over a limit."""
    team = str(row.get("team", "") or "")
    if not team:
        return "—"
    text = f'{_e(team)} <span class="detail">weight {_num(row.get("team_weight")):g}</span>'
    over = [
        lim
        for lim in _limits(row.get("limits"))
        if lim.get("scope") == "team" and lim.get("state") == "over"
    ]
    if over:
        words = "team at limit" if any(lim.get("mode") == "hard" for lim in over) else (
            f"team over {_what(over[0])}"
        )  # fmt: skip
        text += f' <strong class="badge over" data-team-over="{_e(team)}">{_e(words)}</strong>'
    return text


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


def teams_section(views: list[View]) -> str:
    """Return the table of every team with a configured quota or budget ("" if none is)."""
    teams = _merged_teams(views)
    if not teams:
        return ""
    body = []
    for name, (weight, limits) in sorted(teams.items()):
        for key, lim in sorted(limits.items()):
            state = str(lim.get("state") or "ok")
            used, limit = _num(lim.get("used")), _num(lim.get("limit"))
            words = _state_text(lim) or "within"
            model = str(lim.get("model") or "every model")
            body.append(
                f'<tr data-team="{_e(name)}" data-state="{_e(state)}">'
                f"<td>{_e(name)}</td><td>{weight:g}</td>"
                f"<td>{_e(key[0])} ({_e(key[2])}, {_e(model)})</td>"
                f"<td>{_amount(used)} / {_amount(limit)}"
                f"{f' ({used / limit:.0%})' if limit > 0 else ''}</td>"
                f'<td><span class="badge {_e(state)}">{_e(words)}</span></td></tr>'
            )
    head = "".join(
        f'<th scope="col">{h}</th>' for h in ("Team", "Weight", "Limit", "Used / limit", "State")
    )
    return (
        '<section><h2>Teams: weights, quotas and budgets</h2><table class="teams">'
        "<caption>Each team's use of its limits in the current window</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></section>"
    )
