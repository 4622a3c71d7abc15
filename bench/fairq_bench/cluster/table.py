"""The scale-out table: backend queue peak and light-user TTFT for 1, 2, 4 replicas.

One power user's requests spread over the replicas (a load balancer's round-robin), four
light users on replica 0. Without coordination each replica fills its own gate, so the
backend's FIFO queue grows with the replica count and the light users wait behind it; with
the shared gate it stays at the threshold.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from fairq_bench.cluster.setup import QueueWatcher, by_replica, running_cluster
from fairq_bench.report import markdown_table
from fairq_bench.workload import RequestResult, RequestSpec, replay

__all__ = [
    "TableRow",
    "plot_table",
    "rows_from_markdown",
    "run_table",
    "table_markdown",
    "table_workload",
]

LIGHT_USERS = 4


def table_workload(power: int = 60, power_tokens: int = 300, light: int = 3) -> list[RequestSpec]:
    """The power user's ``power`` requests at once; each light user's ``light``, 1 s apart."""
    specs = [
        RequestSpec("power", f"Long report on queueing, part {i}.", power_tokens)
        for i in range(power)
    ]
    for u in range(LIGHT_USERS):
        specs += [
            RequestSpec(f"light-{u}", f"Short question {u}.{i}?", 16, at=0.5 + i + 0.1 * u)
            for i in range(light)
        ]
    return specs


@dataclass(frozen=True)
class TableRow:
    """Runs of one replica count and coordination, pooled.

    Attributes:
        peak_waiting: the backend's longest waiting queue in any of the runs.
        light_ttft_mean: mean over every light request of every run.
        light_ttft_max: the longest light-user TTFT of any run.
        light_ttft_runs: each run's light-user TTFT mean (the spread between runs).
        makespan: mean time to the last answer.

    """

    replicas: int
    coordinated: bool
    peak_waiting: float
    light_ttft_mean: float
    light_ttft_max: float
    errors: int
    makespan: float
    light_ttft_runs: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Run:
    peak_waiting: float
    light: list[float]
    errors: int
    makespan: float


async def run_one(
    replicas: int, coordinated: bool, specs: list[RequestSpec], speed: float = 1.0
) -> _Run:
    """Run the workload once on a fresh simulator (at ``speed``) and fresh replicas."""
    async with running_cluster(replicas, coordinated, speed=speed) as cluster:
        watcher = QueueWatcher(cluster.backend_url)
        watcher.start()
        pick = {s.user: 0 for s in specs if s.user.startswith("light")}
        started = time.monotonic()
        results: list[RequestResult] = await replay(specs, by_replica(cluster.senders, pick))
        await watcher.stop()
    return _Run(
        peak_waiting=watcher.peak(started),
        light=[r.ttft for r in results if r.spec.user.startswith("light") and not r.error],
        errors=sum(1 for r in results if r.error),
        makespan=max(r.done for r in results),
    )


def _pool(replicas: int, coordinated: bool, runs: list[_Run]) -> TableRow:
    light = [t for r in runs for t in r.light]
    return TableRow(
        replicas=replicas,
        coordinated=coordinated,
        peak_waiting=max(r.peak_waiting for r in runs),
        light_ttft_mean=statistics.fmean(light) if light else float("nan"),
        light_ttft_max=max(light, default=float("nan")),
        errors=sum(r.errors for r in runs),
        makespan=statistics.fmean(r.makespan for r in runs),
        light_ttft_runs=tuple(statistics.fmean(r.light) if r.light else math.nan for r in runs),
    )


async def run_table(
    counts: list[int], specs: list[RequestSpec], repeats: int = 1
) -> list[TableRow]:
    """Every replica count, alone then sharing the gate, ``repeats`` times interleaved.

    Interleaving spreads the machine's slow moments over every configuration instead of
    letting them fall on one.
    """
    configs = [(n, coordinated) for n in counts for coordinated in (False, True)]
    runs: dict[tuple[int, bool], list[_Run]] = {c: [] for c in configs}
    for round_ in range(repeats):
        for n, coordinated in configs:
            run = await run_one(n, coordinated, specs)
            runs[(n, coordinated)].append(run)
            light = statistics.fmean(run.light) if run.light else math.nan
            print(
                f"  [{round_ + 1}/{repeats}] {n} replica(s), "
                f"{'shared gate' if coordinated else 'alone      '}: backend waiting peak "
                f"{run.peak_waiting:g}, light TTFT mean {light:.2f} s, makespan "
                f"{run.makespan:.1f} s",
                flush=True,
            )
    return [_pool(n, coordinated, runs[(n, coordinated)]) for n, coordinated in configs]


def table_markdown(rows: list[TableRow]) -> str:
    """The issue's table, side by side: alone vs shared gate, and the ratios to 1 replica.

    Every row is compared with one replica alone (the single process as it runs without
    ``[cluster]``) and with one replica of its own kind (alone, or with Redis).
    """
    base = {r.coordinated: r for r in rows if r.replicas == 1}

    def ratio(row: TableRow, one: TableRow | None) -> str:
        if one is None or not one.light_ttft_mean:
            return "-"
        return f"{row.light_ttft_mean / one.light_ttft_mean:.2f}x"

    out = []
    for r in rows:
        spread = ", ".join(f"{t:.2f}" for t in r.light_ttft_runs)
        out.append(
            (
                r.replicas,
                "Redis (shared)" if r.coordinated else "none",
                f"{r.peak_waiting:g}",
                f"{r.light_ttft_mean:.2f} s / {r.light_ttft_max:.2f} s",
                ratio(r, base.get(False)),
                ratio(r, base.get(r.coordinated)),
                spread,
                f"{r.makespan:.1f} s",
                r.errors,
            )
        )
    header = ("replicas", "coordination", "backend waiting, peak", "light-user TTFT mean / max",
              "vs 1 replica alone", "vs 1 replica of its kind", "per-run means (s)", "makespan",
              "errors")  # fmt: skip
    return markdown_table(header, out)


def plot_table(rows: list[TableRow], path: Path) -> None:
    """Two panels against the replica count: backend waiting peak and light-user TTFT mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for coordinated, label in ((False, "replicas alone"), (True, "shared gate (Redis)")):
        mine = sorted((r for r in rows if r.coordinated is coordinated), key=lambda r: r.replicas)
        xs = [r.replicas for r in mine]
        left.plot(xs, [r.peak_waiting for r in mine], marker="o", label=label)
        right.plot(xs, [r.light_ttft_mean for r in mine], marker="o", label=label)
    left.set_title("backend waiting queue, peak")
    right.set_title("light-user TTFT mean (s)")
    counts = sorted({r.replicas for r in rows})
    for ax in (left, right):
        ax.set_xlabel("replicas")
        ax.set_xticks(counts)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rows_from_markdown(text: str) -> list[TableRow]:
    """Read back the rows :func:`table_markdown` wrote (to plot an earlier run)."""
    rows = []
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 9:
            continue
        mean, peak_max = cells[3].split(" / ")
        rows.append(
            TableRow(
                replicas=int(cells[0]),
                coordinated=cells[1] != "none",
                peak_waiting=float(cells[2]),
                light_ttft_mean=float(mean.removesuffix(" s")),
                light_ttft_max=float(peak_max.removesuffix(" s")),
                errors=int(cells[8]),
                makespan=float(cells[7].removesuffix(" s")),
                light_ttft_runs=tuple(float(x) for x in cells[6].split(", ") if x),
            )
        )
    return rows
