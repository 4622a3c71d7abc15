"""Summaries, tables and plots of workload results."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Never

from tqdm import tqdm

from fairq_bench.workload import RequestResult

__all__ = ["Progress", "RunSummary", "markdown_table", "percentile", "plot_ttft", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass(frozen=True)
class RunSummary:
    """Headline figures of one run for one group of users."""

    label: str
    requests: int
    errors: int
    ttft_p50: float
    ttft_p99: float
    ttft_max: float
    makespan: float
    tokens_per_second: float


def summarize(
    label: str, results: Sequence[RequestResult], users: Callable[[str], bool] = lambda u: True
) -> RunSummary:
    """Summarize the results of the users selected by ``users``.

    Throughput counts requested tokens of successful requests (the workloads ask for exact
    lengths with ``ignore_eos``) over the group's makespan: first send to last completion.
    """
    mine = [r for r in results if users(r.spec.user)]
    ok = [r for r in mine if not r.error]
    ttfts = [r.ttft for r in ok]
    makespan = (max(r.done for r in mine) - min(r.sent for r in mine)) if mine else math.nan
    tokens = sum(r.spec.max_tokens for r in ok)
    return RunSummary(
        label=label,
        requests=len(mine),
        errors=len(mine) - len(ok),
        ttft_p50=statistics.median(ttfts) if ttfts else math.nan,
        ttft_p99=percentile(ttfts, 99),
        ttft_max=max(ttfts) if ttfts else math.nan,
        makespan=makespan,
        tokens_per_second=tokens / makespan if makespan and makespan > 0 else math.nan,
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render a GitHub-flavoured markdown table."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return "n/a" if math.isnan(v) else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def plot_ttft(
    path: Path,
    panels: Sequence[tuple[str, Sequence[RequestResult]]],
    title: str,
) -> None:
    """Scatter each request's TTFT against its send time, one panel per run, one colour per user."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), sharey=True)
    axes_list = list(axes) if len(panels) > 1 else [axes]
    for ax, (name, results) in zip(axes_list, panels, strict=True):
        users = sorted({r.spec.user for r in results})
        for user in users:
            rs = [r for r in results if r.spec.user == user and not r.error]
            ax.scatter([r.sent for r in rs], [r.ttft for r in rs], s=14, label=user)
        ax.set_title(name)
        ax.set_xlabel("request sent at (s)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes_list[0].set_ylabel("time to first token (s, log)")
    axes_list[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Progress:
    """Request progress on stderr: a bar with rate and ETA on a terminal, else decile lines.

    The bar is tqdm's; piped or captured output (CI logs) gets one line per tenth instead of
    carriage-return redraws.
    """

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.errors = 0
        self._tty = sys.stderr.isatty()
        self._last_decile = -1
        self._bar: tqdm[Never] | None = None
        if self._tty:
            self._bar = tqdm(total=total, desc=f"  {label}", unit="req", file=sys.stderr,
                             dynamic_ncols=True, leave=True)  # fmt: skip

    def __call__(self, result: RequestResult) -> None:
        self.done += 1
        self.errors += bool(result.error)
        if self._bar is not None:
            if result.error:
                self._bar.set_postfix(errors=self.errors, refresh=False)
            self._bar.update(1)
            if self.done == self.total:
                self._bar.close()
            return
        decile = self.done * 10 // self.total
        if decile != self._last_decile or self.done == self.total:
            self._last_decile = decile
            errors = f", {self.errors} errors" if self.errors else ""
            print(f"  {self.label}: {self.done}/{self.total} requests done{errors}",
                  file=sys.stderr, flush=True)  # fmt: skip
