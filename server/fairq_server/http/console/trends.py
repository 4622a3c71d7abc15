"""The trends view: the console's recent figures as small lines (sparklines) in inline SVG.

Each figure of :class:`~fairq_server.observe.history.LiveHistory` is drawn with its last
value, its highest and its span in words.
Markup written here like the rest of the console (no script, no inline style: the strict CSP
holds; colours and sizes are in ``console.css``), every name escaped. Each line's values are
also in the ``<svg>``'s ``data-values`` (tests, scripts) and summed up in its ``<title>`` and
caption (screen readers). A line breaks where a sample has no value. Rendering walks the
samples once per figure; the feed renders it once per sample, not per refresh.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fairq_server.http.console.text import esc as _e
from fairq_server.observe.history import Trend

__all__ = ["trends_fragment"]

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


def _sparkline(trend: Trend, index: int, span: str) -> str:
    known = [v for v in trend.values if v is not None]
    last = next((v for v in reversed(trend.values) if v is not None), None)
    top = max(known, default=0.0)
    now = _figure(last, trend.unit) if last is not None else "—"
    group = _OTHERS.get(trend.group, trend.group)
    summary = f"{group}, {trend.name}: now {now}, highest {_figure(top, trend.unit)}"
    summary += f" over the last {span}"
    lines = "".join(
        f'<polyline class="s{index % 9}" points="{run}"/>' if " " in run else
        f'<circle class="s{index % 9}" r="1.5" cx="{run.split(",")[0]}" cy="{run.split(",")[1]}"/>'
        for run in _points(trend.values, top)
    )  # fmt: skip
    data = ",".join("" if v is None else f"{v:.6g}" for v in trend.values)
    return (
        f'<figure class="trend" data-group="{_e(trend.group)}" data-name="{_e(trend.name)}">'
        f'<svg class="spark" viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(summary)}" '
        f'data-values="{data}" data-last="{"" if last is None else f"{last:.6g}"}">'
        f"<title>{_e(summary)}</title>"
        f'<line class="base" x1="0" y1="{_H - _PAD}" x2="{_W}" y2="{_H - _PAD}"/>{lines}</svg>'
        f"<figcaption><strong>{_e(group)}</strong> {_e(trend.name)}: "
        f'<span class="now">{_e(now)}</span> <span class="detail">(highest '
        f"{_e(_figure(top, trend.unit))})</span></figcaption></figure>"
    )


def _span(times: Sequence[float]) -> str:
    if len(times) < 2:
        return "moment"
    seconds = times[-1] - times[0]
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def trends_fragment(trends: Sequence[Trend], times: Sequence[float], here: str = "") -> str:
    """Return the trends view's live fragment.

    Args:
        trends: the figures over the kept samples (:meth:`LiveHistory.trends`).
        times: the samples' times (Unix seconds), oldest first.
        here: this replica's name (a cluster: the figures are this replica's).

    """
    if len(times) < 2:
        return '<p class="empty">Collecting: the first figures appear after two samples.</p>'
    span = _span(times)
    start = time.strftime("%H:%M:%S", time.gmtime(times[0]))
    end = time.strftime("%H:%M:%S UTC", time.gmtime(times[-1]))
    whose = f" on replica {_e(here)}" if here else ""
    out = [
        f'<p class="detail">{len(times)} samples from {start} to {end}{whose}; each line '
        "is scaled to its own highest value.</p>"
    ]
    for kind, title in _SECTIONS:
        chosen = [t for t in trends if t.group.split(" ", 1)[0] == kind]
        if not chosen:
            continue
        figures = "".join(_sparkline(t, i, span) for i, t in enumerate(chosen))
        out.append(f'<section><h2>{_e(title)}</h2><div class="trends">{figures}</div></section>')
    return "".join(out)
