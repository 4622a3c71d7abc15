"""The trends view: the console's recent figures as small lines (sparklines) in inline SVG.

Each figure of :class:`~fairq_server.observe.history.LiveHistory` is drawn with its last
value, its highest and its span in words.
Drawn by ``templates/trends.html`` like the rest of the console (no script, no inline style:
the strict CSP holds; colours and sizes are in ``console.css``), every name escaped; this
module computes the points and the words. Each line's values are
also in the ``<svg>``'s ``data-values`` (tests, scripts) and summed up in its ``<title>`` and
caption (screen readers). A line breaks where a sample has no value. Rendering walks the
samples once per figure; the feed renders it once per sample, not per refresh.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace

from markupsafe import Markup

from fairq_server.console.templating import render
from fairq_server.observe.history import Trend

__all__ = ["trends_fragment", "trends_off"]

_W, _H, _PAD = 240, 48, 3
_SECTIONS = (
    ("model", "Queues per model"),
    ("tier", "Waits per tier (mean over each interval)"),
    ("all", "Tokens per second"),
    (
        "team",
        "Per team: tokens per second, the most queued, and the waits of those who "
        "waited the most (mean over each interval; the other teams together)",
    ),
    (
        "user",
        "Per user: the most served (tokens per second, about the last minute), the most "
        "queued, and the waits of those who waited the most (the other users together)",
    ),
)
# The group of a kind's "others" (no name can be empty, so no named group is spelt so).
_OTHERS = {"team": "other teams", "user": "other users"}


def _figure(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "requests":
        return f"{value:.0f}"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def _points(values: Sequence[float | None], top: float) -> list[str]:
    """Return the polylines' point lists: one per run of samples with a value."""
    runs: list[str] = []
    current: list[str] = []
    step = (_W - 2 * _PAD) / max(1, len(values) - 1)
    for i, value in enumerate(values):
        if value is None:
            if current:
                runs.append(" ".join(current))
            current = []
            continue
        x = _PAD + i * step
        y = _H - _PAD - (value / top) * (_H - 2 * _PAD) if top > 0 else _H - _PAD
        current.append(f"{x:.1f},{y:.1f}")
    if current:
        runs.append(" ".join(current))
    return runs


def _sparkline(trend: Trend, index: int, span: str) -> SimpleNamespace:
    """Return one figure's line as the template draws it."""
    known = [v for v in trend.values if v is not None]
    last = next((v for v in reversed(trend.values) if v is not None), None)
    top = max(known, default=0.0)
    now = _figure(last, trend.unit) if last is not None else "—"
    highest = _figure(top, trend.unit)
    shown = _OTHERS.get(trend.group, trend.group)
    return SimpleNamespace(
        group=trend.group,
        shown=shown,
        name=trend.name,
        summary=f"{shown}, {trend.name}: now {now}, highest {highest} over the last {span}",
        data=",".join("" if v is None else f"{v:.6g}" for v in trend.values),
        last="" if last is None else f"{last:.6g}",
        colour=f"s{index % 9}",
        # A run of one sample is a dot; longer runs are lines.
        runs=[
            (run, None) if " " in run else (None, run.split(","))
            for run in _points(trend.values, top)
        ],
        now=now,
        highest=highest,
    )


def _span(times: Sequence[float]) -> str:
    if len(times) < 2:
        return "moment"
    seconds = times[-1] - times[0]
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def trends_fragment(trends: Sequence[Trend], times: Sequence[float], here: str = "") -> Markup:
    """Return the trends view's live fragment.

    Args:
        trends: the figures over the kept samples (:meth:`LiveHistory.trends`).
        times: the samples' times (Unix seconds), oldest first.
        here: this replica's name (a cluster: the figures are this replica's).

    """
    if len(times) < 2:
        return render("trends.html", samples=len(times))
    span = _span(times)
    sections = []
    for kind, title in _SECTIONS:
        chosen = [t for t in trends if t.group.split(" ", 1)[0] == kind]
        if chosen:
            sections.append((title, [_sparkline(t, i, span) for i, t in enumerate(chosen)]))
    return render(
        "trends.html",
        samples=len(times),
        start=time.strftime("%H:%M:%S", time.gmtime(times[0])),
        end=time.strftime("%H:%M:%S UTC", time.gmtime(times[-1])),
        here=here,
        sections=sections,
        size=(_W, _H, _PAD),
    )


def trends_off() -> Markup:
    """Return the trends view's fragment when trends are off."""
    return render("trends.html", samples=-1)
