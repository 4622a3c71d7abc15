"""Usage plots as SVG rendered on the server: one line per team, user or model over time.

The console has no front-end toolchain and a strict content security policy, so the plot is
markup from a template (``templates/plot.html``, autoescaped) like the rest of the console,
with the coordinates computed here: an inline ``<svg>`` (no script, no inline
style; colours come from classes in ``console.css``) with each point's value in its
``<title>`` (a tooltip, read by screen readers) and in ``data-`` attributes, and the same
numbers in a table beneath it. Every value is escaped.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

from markupsafe import Markup

from fairq_server.console.templating import render
from fairq_server.store.series import Series

__all__ = ["MAX_LINES", "lines_of", "usage_plot"]

# Lines drawn; further groups are summed into one line ("others") so the plot stays readable.
MAX_LINES = 8
# Points carry a marker (and a tooltip) up to this many buckets; beyond, the line alone.
_MAX_MARKERS = 200
_W, _H = 960, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 16, 14, 40
_OTHERS = "(others)"
_UNITS = {
    "output_tokens": "output tokens",
    "input_tokens": "input tokens",
    "cost": "cost",
    "requests": "requests",
}


def _label(group: str | None) -> str:
    return "(none)" if group is None else group


def _fmt(value: float, measure: str) -> str:
    if measure == "cost":
        return f"{value:.4f}"
    return f"{value:.0f}"


def _tick(value: float, measure: str) -> str:
    # Whole numbers written out (1000000, not 1e+06); fractions of a token or of a cost unit
    # kept as they are.
    if measure == "cost" or value != int(value):
        return f"{value:g}" if value < 1000 else f"{value:.0f}"
    return f"{value:.0f}"


def _nice_top(value: float) -> float:
    """Return a round number at or above ``value`` for the y axis (1, 2 or 5 times 10^k)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return float(factor * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def _when(start: int, step: int) -> str:
    pattern = "%Y-%m-%d %H:%M" if step < 86400 else "%Y-%m-%d"
    return time.strftime(pattern, time.gmtime(start)) + " UTC"


def lines_of(series: Series, measure: str) -> list[tuple[str, list[float]]]:
    """Return the lines to draw: the largest groups by ``measure``, the rest as one."""
    groups = sorted(
        series.values.get(measure, {}).items(), key=lambda kv: (-sum(kv[1]), _label(kv[0]))
    )
    lines = [(_label(g), v) for g, v in groups[:MAX_LINES]]
    rest = groups[MAX_LINES:]
    if rest:
        lines.append((_OTHERS, [sum(col) for col in zip(*(v for _, v in rest), strict=True)]))
    return lines


def usage_plot(series: Series, measure: str, by: str) -> Markup:
    """Return the plot of ``measure`` per ``by`` over the series' buckets, and its table."""
    unit = _UNITS.get(measure, measure)
    lines = lines_of(series, measure)
    if not lines:
        return render("plot.html", lines=[])
    n = len(series.starts)
    top = _nice_top(max(max(v) for _, v in lines))
    inner_w, inner_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(i: int) -> float:
        return _LEFT + (inner_w * i / (n - 1) if n > 1 else inner_w / 2)

    def y(v: float) -> float:
        return _TOP + inner_h * (1 - v / top)

    def when(i: int) -> str:
        return _when(series.starts[i], series.step)

    grid = [  # the y grid and its labels
        (f"{y(top * frac):.1f}", f"{y(top * frac) + 4:.1f}", _tick(top * frac, measure))
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0)
    ]
    ticks = [  # first, middle and last bucket on the x axis
        (
            f"{x(i):.1f}",
            "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle",
            when(i),
        )
        for i in sorted({0, n // 2, n - 1})
    ]
    drawn = [
        SimpleNamespace(
            name=name,
            data=",".join(_fmt(v, measure) for v in values),
            points=" ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values)),
            markers=[
                (f"{x(i):.1f}", f"{y(v):.1f}", series.starts[i], _fmt(v, measure), when(i))
                for i, v in enumerate(values)
                if v
            ]
            if n <= _MAX_MARKERS
            else [],
            total=_fmt(sum(values), measure),
        )
        for name, values in lines
    ]
    buckets = [  # the plotted numbers, buckets with some usage only
        (when(i), [_fmt(values[i], measure) for _, values in lines])
        for i in range(n)
        if any(values[i] for _, values in lines)
    ]
    return render(
        "plot.html",
        lines=drawn,
        buckets=buckets,
        measure=measure,
        by=by,
        unit=unit,
        step=series.step,
        title=f"{unit.capitalize()} per {'hour' if series.step < 86400 else 'day'}, by {by}",
        grid=grid,
        ticks=ticks,
        box=(_W, _H, _LEFT, _RIGHT, _BOTTOM),
    )
