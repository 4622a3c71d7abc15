"""The scale-out table: backend queue peak and light-user TTFT for 1, 2, 4 replicas.

One power user's requests spread over the replicas (a load balancer's round-robin), four
light users on replica 0. Without coordination each replica fills its own gate, so the
backend's FIFO queue grows with the replica count and the light users wait behind it; with
the shared gate it stays at the threshold.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from fairq_server.bench.cluster.setup import QueueWatcher, by_replica, running_cluster
from fairq_server.bench.report import markdown_table
from fairq_server.bench.workload import RequestResult, RequestSpec, replay

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
    """One run: replica count, coordination, what the backend and the light users saw."""

    replicas: int
    coordinated: bool
    peak_waiting: float
    light_ttft_mean: float
    light_ttft_max: float
    errors: int
    makespan: float


async def run_one(
    replicas: int, coordinated: bool, specs: list[RequestSpec], speed: float = 1.0
) -> TableRow:
    """Run the workload once on a fresh simulator (at ``speed``) and fresh replicas."""
    async with running_cluster(replicas, coordinated, speed=speed) as cluster:
        watcher = QueueWatcher(cluster.backend_url)
        watcher.start()
        pick = {s.user: 0 for s in specs if s.user.startswith("light")}
        started = time.monotonic()
        results: list[RequestResult] = await replay(specs, by_replica(cluster.senders, pick))
        await watcher.stop()
    light = [r.ttft for r in results if r.spec.user.startswith("light") and not r.error]
    return TableRow(
        replicas=replicas,
        coordinated=coordinated,
        peak_waiting=watcher.peak(started),
        light_ttft_mean=statistics.fmean(light) if light else float("nan"),
        light_ttft_max=max(light, default=float("nan")),
        errors=sum(1 for r in results if r.error),
        makespan=max(r.done for r in results),
    )


async def run_table(counts: list[int], specs: list[RequestSpec]) -> list[TableRow]:
    """Every replica count, uncoordinated then coordinated (one replica: both, as cost)."""
    rows = []
    for n in counts:
        for coordinated in (False, True):
            row = await run_one(n, coordinated, specs)
            print(
                f"  {n} replica(s), {'shared gate' if coordinated else 'alone      '}: "
                f"backend waiting peak {row.peak_waiting:g}, light TTFT mean "
                f"{row.light_ttft_mean:.2f} s / max {row.light_ttft_max:.2f} s",
                flush=True,
            )
            rows.append(row)
    return rows


def table_markdown(rows: list[TableRow]) -> str:
    """The issue's table, side by side: alone vs shared gate, and the ratio to 1 replica."""
    base = {r.coordinated: r for r in rows if r.replicas == 1}
    out = []
    for r in rows:
        one = base.get(r.coordinated)
        ratio = (
            r.light_ttft_mean / one.light_ttft_mean if one and one.light_ttft_mean else float("nan")
        )
        out.append(
            (
                r.replicas,
                "Redis (shared)" if r.coordinated else "none",
                f"{r.peak_waiting:g}",
                f"{r.light_ttft_mean:.2f} s / {r.light_ttft_max:.2f} s",
                f"{ratio:.2f}x",
                r.errors,
            )
        )
    header = ("replicas", "coordination", "backend waiting, peak", "light-user TTFT mean / max",
              "TTFT mean vs 1 replica", "errors")  # fmt: skip
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
    for ax in (left, right):
        ax.set_xlabel("replicas")
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
        if len(cells) < 6:
            continue
        mean, peak_max = cells[3].split(" / ")
        rows.append(
            TableRow(
                replicas=int(cells[0]),
                coordinated=cells[1] != "none",
                peak_waiting=float(cells[2]),
                light_ttft_mean=float(mean.removesuffix(" s")),
                light_ttft_max=float(peak_max.removesuffix(" s")),
                errors=int(cells[5]),
                makespan=float("nan"),
            )
        )
    return rows
