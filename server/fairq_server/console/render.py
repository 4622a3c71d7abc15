"""The console's HTML, rendered on the server from the replicas' live views.

The live part of each page (a ``<div id="live">``) is one fragment rendered here; the page
carries it at first, and the same fragment is pushed over server-sent events on every refresh
(``console.js`` merges it in). The markup is in the templates (``templates/``, autoescaped:
:mod:`.templating`); this module reads the views into the figures they write, and every value
is escaped there, views read back from Redis included.

Views arrive as JSON-shaped dicts (:meth:`LiveView.to_json`, this replica's and the others'
from Redis alike) and are read defensively: a missing or mistyped field shows as a blank.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from markupsafe import Markup

from fairq_server.console.cells import limits_of, team_of, team_rows
from fairq_server.console.templating import render

__all__ = ["VIEWS", "fragment", "login_page", "message_page", "page"]

# Path name -> title, in the navigation's order.
VIEWS = {"queues": "Queues", "trends": "Trends", "backends": "Backends", "cluster": "Cluster"}
# The views over fairq's store (when it has one): rendered per request, not pushed.
STORE_VIEWS = {"usage": "Usage", "keys": "Keys", "teams": "Teams & limits", "audit": "Audit"}

View = dict[str, Any]


def _num(value: object, default: float = 0.0) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )


def _list(value: object) -> list[Any]:
    # Tuples in this replica's own view, lists once a view went through JSON (Redis).
    return list(value) if isinstance(value, list | tuple) else []


def _pair(value: object, size: int = 2) -> bool:
    return isinstance(value, list | tuple) and len(value) == size


def page(view: str, user: str, csrf: str, live: Markup, store: bool = False) -> Markup:
    """Return a whole console page for ``view`` with its body ``live`` (rendered markup).

    ``store``: fairq has a store, so the usage and keys views are linked.
    """
    views = {**VIEWS, **STORE_VIEWS} if store else VIEWS
    return render(
        "page.html",
        views=views,
        view=view,
        title=views[view],
        live_view=view in VIEWS,
        user=user,
        csrf=csrf,
        live=live,
    )


def login_page(error: str = "") -> Markup:
    """Return the login form (``error``: why the last attempt was refused)."""
    return render("login.html", title="Log in", error=error)


def message_page(title: str, text: str) -> Markup:
    """Return a short page saying ``text`` (a refusal)."""
    return render("message.html", title=title, text=text)


def fragment(view: str, views: list[View], here: str) -> Markup:
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


def _queues(views: list[View]) -> Markup:
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
    shown = []
    for name, entry in sorted(models.items()):
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
        shown.append(
            SimpleNamespace(
                name=name,
                total=sum(entry["tiers"].values()),
                tiers=list(entry["tiers"].items()),
                users=entry["users"],
                running=entry["running"],
                running_users=entry["running_users"],
                limited=any(r.get("limits") for _, r in rows),
                rows=[_user_row(replica, r) for replica, r in rows],
            )
        )
    return render("queues.html", teams=team_rows(views), models=shown, cluster=cluster)


def _user_row(replica: str, r: dict[str, Any]) -> SimpleNamespace:
    """Return a user row's figures as the queue view writes them."""
    share, entitled = _num(r.get("share")), _num(r.get("entitled"))
    queued = int(_num(r.get("queued")))
    return SimpleNamespace(
        tier=r.get("tier", ""),
        user=r.get("user", ""),
        team=team_of(r),
        replica=replica,
        queued=queued,
        running=int(_num(r.get("running"))),
        position=str(int(_num(r.get("position")))) if queued else "—",
        waiting=f"{_num(r.get('waiting_seconds')):.1f} s" if queued else "—",
        state=str(r.get("state", "")),
        share=f"{share:.3f}",
        share_percent=f"{share:.0%}",
        entitled_percent=f"{entitled:.0%}",
        status=str(r.get("status", "")),
        # Its next request is a continuation, waiting for a slot again.
        preempted=int(_num(r.get("preempted"))),
        limits=limits_of(r),
    )


def _in_flight_by_backend(views: list[View]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for v in views:
        for b in _list(v.get("backends")):
            if isinstance(b, dict):
                bid = str(b.get("id", ""))
                totals[bid] = totals.get(bid, 0) + int(_num(b.get("in_flight")))
    return totals


def _preemptions_by_backend(views: list[View]) -> dict[str, SimpleNamespace]:
    """Return each backend's preemptions, summed over every replica's view."""
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
    return {
        bid: SimpleNamespace(
            total=sum(per.values()),
            reasons=sorted(per.items()),
            tokens=tokens.get(bid, 0),
            resumed=sorted(resumed.get(bid, {}).items()),
        )
        for bid, per in reasons.items()
    }


def _figure(value: object) -> str:
    """Write a backend's metric, or a dash where it has none now (down, unknown, no metrics)."""
    return f"{_num(value):g}" if isinstance(value, int | float) else "—"


def _backends(views: list[View]) -> Markup:
    if not views or not _list(views[0].get("backends")):
        return render("backends.html", rows=[], cluster=False)
    cluster = len(views) > 1
    totals = _in_flight_by_backend(views)
    preemptions = _preemptions_by_backend(views)
    rows = []
    for b in _list(views[0].get("backends")):  # this replica's view of every backend
        if not isinstance(b, dict):
            continue
        bid = str(b.get("id", ""))
        tpot, kv = b.get("tpot_seconds"), b.get("kv_usage")
        flight = str(int(_num(b.get("in_flight"))))
        if cluster:
            flight += f" / {totals.get(bid, 0)}"
        rows.append(
            SimpleNamespace(
                id=bid,
                models=", ".join(str(m) for m in _list(b.get("models"))),
                health=str(b.get("health", "")),
                # Deregistered: takes no new work, finishes what it runs.
                draining=bool(b.get("draining")),
                left=totals.get(bid, 0),
                error=str(b.get("error", "")),
                running=_figure(b.get("running")),
                waiting=_figure(b.get("waiting")),
                kv=f"{_num(kv):.0%}" if isinstance(kv, int | float) else "—",
                flight=flight,
                tpot=f"{_num(tpot) * 1000:.0f} ms" if tpot is not None else "—",
                gates=[
                    (g[0], f" ({_num(g[2]) * 1000:.0f} ms)" if g[2] is not None else "", str(g[1]))
                    for g in _list(b.get("gates"))
                    if _pair(g, 3)
                ],
                preemptions=preemptions.get(bid),
            )
        )
    return render("backends.html", rows=rows, cluster=cluster)


def _cluster(views: list[View], here: str) -> Markup:
    if not here:
        return render("cluster.html", replicas=None, backends=[])
    now = time.time()
    replicas = []
    for v in views:
        replicas.append(
            SimpleNamespace(
                name=str(v.get("replica", "")),
                age=f"{max(0.0, now - _num(v.get('taken_at'), now)):.1f} s",
                queued=sum(
                    int(_num(p[1]))
                    for m in _list(v.get("models"))
                    if isinstance(m, dict)
                    for p in _list(m.get("tiers"))
                    if _pair(p)
                ),
                contending=int(_num(v.get("contending"))),
                flight=sum(
                    int(_num(b.get("in_flight")))
                    for b in _list(v.get("backends"))
                    if isinstance(b, dict)
                ),
            )
        )
    backends = sorted(_in_flight_by_backend(views).items())
    return render("cluster.html", replicas=replicas, here=here, backends=backends)
