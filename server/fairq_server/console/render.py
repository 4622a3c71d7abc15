"""The console's HTML, rendered on the server from the replicas' live views.

The live part of each page (a ``<div id="live">``) is one fragment rendered here; the page
carries it at first, and the same fragment is pushed over server-sent events on every refresh
(``console.js`` swaps it in). So the markup is written once, in Python, and every value in it
goes through :func:`html.escape` — views read back from Redis included.

Views arrive as JSON-shaped dicts (:meth:`LiveView.to_json`, this replica's and the others'
from Redis alike) and are read defensively: a missing or mistyped field shows as a blank.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from fairq_server.console.cells import limits_cell, team_cell, teams_section
from fairq_server.console.text import esc as _e

__all__ = ["VIEWS", "fragment", "login_page", "message_page", "page"]

# Path name -> title, in the navigation's order.
VIEWS = {"queues": "Queues", "trends": "Trends", "backends": "Backends", "cluster": "Cluster"}
# The views over fairq's store (when it has one): rendered per request, not pushed.
STORE_VIEWS = {"usage": "Usage", "keys": "Keys", "teams": "Teams & limits", "audit": "Audit"}

View = dict[str, Any]

# Filters every table's rows as one types (console.js); sorting: the headers.
_FILTER = (
    '<p class="filter"><label for="filter">Filter rows</label> '
    '<input id="filter" type="search" autocomplete="off" aria-describedby="filter-help"> '
    '<span id="filter-help" class="detail">Rows holding this text; sort a table by its column '
    "headers (click, Enter).</span></p>"
)


def _num(value: object, default: float = 0.0) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )


def _list(value: object) -> list[Any]:
    # Tuples in this replica's own view, lists once a view went through JSON (Redis).
    return list(value) if isinstance(value, list | tuple) else []


def _pair(value: object, size: int = 2) -> bool:
    return isinstance(value, list | tuple) and len(value) == size


def _head(title: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} · fairq console</title>"
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script></head><body>'
    )


def page(view: str, user: str, csrf: str, live: str, store: bool = False) -> str:
    """Return a whole console page for ``view`` with its fragment ``live``.

    ``store``: fairq has a store, so the usage and keys views are linked.
    """
    views = {**VIEWS, **STORE_VIEWS} if store else VIEWS
    nav = "".join(
        f'<a href="/console/{name}"{" aria-current=page" if name == view else ""}>{_e(title)}</a>'
        for name, title in views.items()
    )
    # Only the live views have an event stream (console.js opens it from data-view).
    data_view = f' data-view="{_e(view)}"' if view in VIEWS else ""
    # The status region is announced when it changes (the connection's state only); the
    # time of the last update is beside it, not in it, and the tables are not a live region:
    # a screen reader announcing every refresh could be heard of nothing else.
    status = (
        '<p class="live-status"><span id="status" role="status">Live: updates as they happen.'
        '</span> <span id="updated" class="detail"></span></p>'
        if view in VIEWS
        else ""
    )
    return (
        _head(views[view])
        + '<a class="skip" href="#main">Skip to the content</a>'
        + '<header><p class="brand">fairq console</p>'
        + f'<nav aria-label="Views">{nav}</nav>'
        + '<form method="post" action="/console/logout" class="logout">'
        + f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
        + f"<span>Signed in as <strong>{_e(user)}</strong></span>"
        + '<button type="submit">Log out</button></form></header>'
        + f'<main id="main"{data_view}><h1>{_e(views[view])}</h1>'
        + status
        + (_FILTER if view != "trends" else "")  # the trends have no table
        + f'<div id="live" aria-live="off">{live}</div></main></body></html>'
    )


def login_page(error: str = "") -> str:
    """Return the login form (``error``: why the last attempt was refused)."""
    alert = f'<p class="error" role="alert">{_e(error)}</p>' if error else ""
    return (
        _head("Log in")
        + '<main id="main" class="login"><h1>fairq console</h1>'
        + alert
        + '<form method="post" action="/console/login">'
        + '<label for="key">Admin API key or identity token</label>'
        + '<input id="key" name="key" type="password" autocomplete="off" required autofocus>'
        + '<button type="submit">Log in</button></form></main></body></html>'
    )


def message_page(title: str, text: str) -> str:
    """Return a short page saying ``text`` (a refusal)."""
    return (
        _head(title)
        + f'<main id="main" class="login"><h1>{_e(title)}</h1><p>{_e(text)}</p>'
        + '<p><a href="/console/login">Log in with another key</a></p></main></body></html>'
    )


def fragment(view: str, views: list[View], here: str) -> str:
    """Return the live fragment of ``view`` over every replica's ``views``.

    Args:
        view: a name from :data:`VIEWS`.
        views: the replicas' live views (this replica's alone outside a cluster).
        here: this replica's name (empty outside a cluster).

    """
    if view == "backends":
        return _backends(views)
    if view == "cluster":
        return _cluster(views, here)
    return _queues(views)


def _table(caption: str, headers: Iterable[str], rows: list[str]) -> str:
    head = "".join(f'<th scope="col">{_e(h)}</th>' for h in headers)
    return (
        f"<table><caption>{_e(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _row(cells: Iterable[str], data: dict[str, str] | None = None) -> str:
    attrs = "".join(f' data-{k}="{_e(v)}"' for k, v in (data or {}).items())
    return f"<tr{attrs}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _queues(views: list[View]) -> str:
    cluster = len(views) > 1
    models: dict[str, dict[str, Any]] = {}
    for v in views:
        for m in _list(v.get("models")):
            if not isinstance(m, dict):
                continue
            entry = models.setdefault(
                str(m.get("model", "")),
                {"tiers": {}, "users": 0, "running": 0, "running_users": 0, "rows": []},
            )
            for pair in _list(m.get("tiers")):
                if _pair(pair):
                    tier = str(pair[0])
                    entry["tiers"][tier] = entry["tiers"].get(tier, 0) + int(_num(pair[1]))
            for count in ("users", "running", "running_users"):
                entry[count] += int(_num(m.get(count)))
            entry["rows"] += [(str(v.get("replica", "")), r) for r in _list(m.get("rows"))]
    teams = teams_section(views)
    if not models:
        return teams + '<p class="empty">No model has a backend yet.</p>'
    out = [teams]
    for name, entry in sorted(models.items()):
        total = sum(entry["tiers"].values())
        depth = ", ".join(f"{_e(t)} {n}" for t, n in entry["tiers"].items())
        out.append(
            f"<section><h2>Model {_e(name)}: {total} queued, {entry['users']} users waiting; "
            f"{entry['running']} running, {entry['running_users']} users served</h2>"
            f'<p class="depth">By tier: {depth}</p>'
        )
        rows = [(rep, r) for rep, r in entry["rows"] if isinstance(r, dict)]
        # The waiting first (by position), then the users only running.
        rows.sort(
            key=lambda p: (
                _num(p[1].get("position")) < 0,
                _num(p[1].get("position")),
                -_num(p[1].get("waiting_seconds")),
                -_num(p[1].get("running")),
            )
        )
        if not rows:
            out.append('<p class="empty">Nobody is waiting or running.</p></section>')
            continue
        headers = ["Tier", "User", "Team"] + (["Replica"] if cluster else [])
        headers += ["Queued", "Running", "Position", "Waiting", "State"]
        headers += ["Share of service / entitled (last minute)", "Status"]
        limited = any(r.get("limits") for _, r in rows)
        headers += ["Quotas and budgets (used / limit)"] if limited else []
        body = []
        for replica, r in rows:
            share, entitled = _num(r.get("share")), _num(r.get("entitled"))
            status = str(r.get("status", ""))
            meter = (
                f'<meter min="0" max="1" value="{share:.3f}" '
                f'aria-label="share {share:.0%} of service">{share:.0%}</meter> '
                f"{share:.0%} / {entitled:.0%}"
            )
            badge = f'<span class="badge {_e(status)}">{_e(status)}</span>' if status else ""
            preempted = int(_num(r.get("preempted")))
            if preempted:  # its next request is a continuation, waiting for a slot again
                badge += f' <span class="badge preempted">preempted {preempted}x</span>'
            position = int(_num(r.get("position")))
            queued = int(_num(r.get("queued")))
            state = str(r.get("state", ""))
            state_cell = f'<span class="state" data-state="{_e(state)}">{_e(state)}</span>'
            cells = [_e(r.get("tier", "")), _e(r.get("user", "")), team_cell(r)]
            cells += [_e(replica)] if cluster else []
            cells += [
                str(queued),
                str(int(_num(r.get("running")))),
                str(position) if queued else "—",
                f"{_num(r.get('waiting_seconds')):.1f} s" if queued else "—",
                state_cell,
                meter,
                badge,
            ]
            cells += [limits_cell(r)] if limited else []
            data = {"user": str(r.get("user", "")), "state": state}
            body.append(_row(cells, {**data, "running": str(int(_num(r.get("running"))))}))
        out.append(_table(f"Users waiting or running on {name}", headers, body) + "</section>")
    return "".join(out)


def _in_flight_by_backend(views: list[View]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for v in views:
        for b in _list(v.get("backends")):
            if isinstance(b, dict):
                bid = str(b.get("id", ""))
                totals[bid] = totals.get(bid, 0) + int(_num(b.get("in_flight")))
    return totals


def _preemptions_by_backend(views: list[View]) -> dict[str, str]:
    """Return each backend's preemptions cell, summed over every replica's view."""
    reasons: dict[str, dict[str, int]] = {}
    tokens: dict[str, int] = {}
    resumed: dict[str, dict[str, int]] = {}
    for v in views:
        for b in _list(v.get("backends")):
            if not isinstance(b, dict):
                continue
            bid = str(b.get("id", ""))
            per = reasons.setdefault(bid, {})
            for p in _list(b.get("preemptions")):
                if _pair(p):
                    per[str(p[0])] = per.get(str(p[0]), 0) + int(_num(p[1]))
            tokens[bid] = tokens.get(bid, 0) + int(_num(b.get("regenerated_tokens")))
            users = resumed.setdefault(bid, {})
            for p in _list(b.get("resumed")):
                if _pair(p):
                    users[str(p[0])] = users.get(str(p[0]), 0) + int(_num(p[1]))
    cells = {}
    for bid, per in reasons.items():
        total = sum(per.values())
        text = str(total)
        if total:
            text += " (" + ", ".join(f"{_e(r)} {n}" for r, n in sorted(per.items())) + ")"
            text += f'<br><span class="detail">{tokens.get(bid, 0)} tokens generated again</span>'
        if resumed.get(bid):
            who = ", ".join(f"{_e(u)} ({n})" for u, n in sorted(resumed[bid].items()))
            text += f'<br><span class="detail">running after preemption: {who}</span>'
        cells[bid] = text
    return cells


def _figure(value: object) -> str:
    """Write a backend's metric, or a dash where it has none now (down, unknown, no metrics)."""
    return f"{_num(value):g}" if isinstance(value, int | float) else "—"


def _backends(views: list[View]) -> str:
    if not views or not _list(views[0].get("backends")):
        return '<p class="empty">No backend is registered.</p>'
    cluster = len(views) > 1
    totals = _in_flight_by_backend(views)
    headers = ["Backend", "Models", "Health", "Running", "Waiting", "KV cache"]
    headers += ["fairq in flight (here / cluster)" if cluster else "fairq in flight"]
    headers += ["TPOT", "Gate per tier (TPOT limit)", "Preemptions"]
    preemptions = _preemptions_by_backend(views)
    body = []
    for b in _list(views[0].get("backends")):  # this replica's view of every backend
        if not isinstance(b, dict):
            continue
        health = str(b.get("health", ""))
        draining = bool(b.get("draining"))
        error = str(b.get("error", ""))
        health_cell = f'<span class="badge {_e(health)}">{_e(health)}</span>'
        if draining:  # deregistered: takes no new work, finishes what it runs
            left = totals.get(str(b.get("id", "")), 0)
            health_cell += (
                f' <span class="badge draining">draining: {left} of fairq\'s requests left, '
                "no new work</span>"
            )
        if error:
            health_cell += f'<br><span class="detail reason">{_e(error)}</span>'
        tpot = b.get("tpot_seconds")
        gates = []
        for g in _list(b.get("gates")):
            if _pair(g, 3):
                limit = f" ({_num(g[2]) * 1000:.0f} ms)" if g[2] is not None else ""
                verdict = str(g[1])
                gates.append(
                    f'{_e(g[0])}{limit}: <span class="badge {_e(verdict)}">{_e(verdict)}</span>'
                )
        kv = b.get("kv_usage")
        flight = str(int(_num(b.get("in_flight"))))
        if cluster:
            flight += f" / {totals.get(str(b.get('id', '')), 0)}"
        body.append(
            _row(
                [
                    _e(b.get("id", "")),
                    _e(", ".join(str(m) for m in _list(b.get("models")))),
                    health_cell,
                    _figure(b.get("running")),
                    _figure(b.get("waiting")),
                    f"{_num(kv):.0%}" if isinstance(kv, int | float) else "—",
                    flight,
                    f"{_num(tpot) * 1000:.0f} ms" if tpot is not None else "—",
                    "<br>".join(gates),
                    preemptions.get(str(b.get("id", "")), "0"),
                ],
                {
                    "backend": str(b.get("id", "")),
                    "health": health,
                    "draining": "yes" if draining else "no",
                },
            )
        )
    return _table("Backends: their metrics, fairq's load, and the gate", headers, body)


def _cluster(views: list[View], here: str) -> str:
    if not here:
        return (
            '<p class="empty">One process: no cluster is configured, so this replica is the '
            "whole of fairq.</p>"
        )
    now = time.time()
    body = []
    for v in views:
        name = str(v.get("replica", ""))
        queued = sum(
            int(_num(p[1]))
            for m in _list(v.get("models"))
            if isinstance(m, dict)
            for p in _list(m.get("tiers"))
            if _pair(p)
        )
        flight = sum(
            int(_num(b.get("in_flight"))) for b in _list(v.get("backends")) if isinstance(b, dict)
        )
        age = max(0.0, now - _num(v.get("taken_at"), now))
        label = _e(name) + (" (this one)" if name == here else "")
        body.append(
            _row(
                [
                    label,
                    f"{age:.1f} s",
                    str(queued),
                    str(int(_num(v.get("contending")))),
                    str(flight),
                ]
            )
        )
    replicas = _table(
        f"{len(views)} replicas publishing their view",
        ["Replica", "View age", "Queued", "Users contending", "In flight"],
        body,
    )
    totals = _in_flight_by_backend(views)
    shared = [_row([_e(bid), str(n)]) for bid, n in sorted(totals.items())]
    return replicas + _table(
        "Backends: fairq's requests in flight over every replica", ["Backend", "In flight"], shared
    )
