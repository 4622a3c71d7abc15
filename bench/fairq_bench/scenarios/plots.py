"""Line and scatter plots for the scenario reports (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Panel", "Series", "plot_panels"]


@dataclass(frozen=True)
class Series:
    """One line (or set of points) of a panel."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    style: str = "-"
    annotations: Sequence[str] = ()


@dataclass(frozen=True)
class Panel:
    """One subplot."""

    title: str
    series: Sequence[Series]
    xlabel: str = "simulated time (s)"
    ylabel: str = ""
    logy: bool = False
    hlines: Sequence[tuple[float, str]] = field(default_factory=tuple)


def plot_panels(path: Path, panels: Sequence[Panel], title: str, sharey: bool = False) -> None:
    """Draw ``panels`` side by side and save a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels), 3.9), sharey=sharey, squeeze=False
    )
    for ax, panel in zip(axes[0], panels, strict=True):
        _draw(ax, panel)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _draw(ax: Any, panel: Panel) -> None:
    for s in panel.series:
        if s.style in ("o", "s", "^", "x", "."):
            ax.plot(s.xs, s.ys, s.style, label=s.label, markersize=5)
        else:
            ax.plot(s.xs, s.ys, s.style, label=s.label)
        for x, y, text in zip(s.xs, s.ys, s.annotations, strict=False):
            ax.annotate(text, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    for y, label in panel.hlines:
        ax.axhline(y, color="grey", linestyle=":", linewidth=1)
        ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=7)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if any(s.label for s in panel.series):
        ax.legend(fontsize=8)
