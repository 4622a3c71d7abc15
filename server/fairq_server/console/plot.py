"""Usage plots as SVG rendered on the server: one line per team, user or model over time.

The console has no front-end toolchain and a strict content security policy, so the plot is
markup written here, like the rest of the console: an inline ``<svg>`` (no script, no inline
style; colours come from classes in ``console.css``) with each point's value in its
``<title>`` (a tooltip, read by screen readers) and in ``data-`` attributes, and the same
numbers in a table beneath it. Every value is escaped.
"""

from __future__ import annotations

import math
import time

from fairq_server.console.text import esc as _e
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


def usage_plot(series: Series, measure: str, by: str) -> str:
    """Return the plot of ``measure`` per ``by`` over the series' buckets, and its table."""
    unit = _UNITS.get(measure, measure)
    lines = lines_of(series, measure)
    if not lines:
        return '<p class="empty">No usage in this range: nothing to plot.</p>'
    n = len(series.starts)
    top = _nice_top(max(max(v) for _, v in lines))
    inner_w, inner_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(i: int) -> float:
        return _LEFT + (inner_w * i / (n - 1) if n > 1 else inner_w / 2)

    def y(v: float) -> float:
        return _TOP + inner_h * (1 - v / top)

    title = f"{unit.capitalize()} per {'hour' if series.step < 86400 else 'day'}, by {by}"
    parts = [
        f'<svg class="plot" viewBox="0 0 {_W} {_H}" role="img" aria-labelledby="plot-title" '
        f'data-measure="{_e(measure)}" data-step="{series.step}">'
        f'<title id="plot-title">{_e(title)}</title>'
    ]
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):  # the y grid and its labels
        gy = y(top * frac)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>'
            f'<text class="tick" x="{_LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{_e(_tick(top * frac, measure))}</text>"
        )
    for i in sorted({0, n // 2, n - 1}):  # first, middle and last bucket on the x axis
        anchor = "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle"
        parts.append(
            f'<text class="tick" x="{x(i):.1f}" y="{_H - _BOTTOM + 18}" text-anchor="{anchor}">'
            f"{_e(_when(series.starts[i], series.step))}</text>"
        )
    for k, (name, values) in enumerate(lines):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        data = ",".join(_fmt(v, measure) for v in values)
        parts.append(
            f'<g class="s{k}" data-group="{_e(name)}" data-values="{data}">'
            f'<polyline points="{points}"/>'
        )
        if n <= _MAX_MARKERS:
            for i, v in enumerate(values):
                if v:
                    when = _when(series.starts[i], series.step)
                    parts.append(
                        f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" '
                        f'data-start="{series.starts[i]}" data-value="{_fmt(v, measure)}">'
                        f"<title>{_e(name)}, {_e(when)}: {_fmt(v, measure)} {_e(unit)}"
                        "</title></circle>"
                    )
        parts.append("</g>")
    parts.append("</svg>")
    legend = "".join(
        f'<li><svg class="swatch s{k}" viewBox="0 0 14 14" aria-hidden="true">'
        f'<rect width="14" height="14"/></svg> {_e(name)}: '
        f'<span class="total">{_fmt(sum(values), measure)}</span> {_e(unit)}</li>'
        for k, (name, values) in enumerate(lines)
    )
    return (
        '<figure class="usage-plot">'
        + "".join(parts)
        + f'<figcaption><ul class="legend" aria-label="lines and their totals">{legend}</ul>'
        + "</figcaption></figure>"
        + _values_table(series, lines, measure, by, unit)
    )


def _values_table(
    series: Series, lines: list[tuple[str, list[float]]], measure: str, by: str, unit: str
) -> str:
    """Return the plotted numbers as a table (buckets with some usage only), folded."""
    head = "".join(f'<th scope="col">{_e(name)}</th>' for name, _ in lines)
    rows = []
    for i, start in enumerate(series.starts):
        cells = [values[i] for _, values in lines]
        if any(cells):
            rows.append(
                f'<tr><th scope="row">{_e(_when(start, series.step))}</th>'
                + "".join(f"<td>{_fmt(c, measure)}</td>" for c in cells)
                + "</tr>"
            )
    return (
        f"<details><summary>The plotted values ({_e(unit)} by {_e(by)})</summary>"
        f'<table class="plotted"><caption>{_e(unit.capitalize())} per bucket</caption>'
        f'<thead><tr><th scope="col">Bucket</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></details>"
    )
