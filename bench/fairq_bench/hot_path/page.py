"""The hot-path page: this run's figures beside the recorded "before" ones.

The figures are kept in ``hot-path.json`` next to the page; a run made with ``--as-before``
records itself as the "before" column, every other run fills "after" and keeps "before".
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairq_bench.report import markdown_table
from fairq_bench.scenarios.docs import Report

__all__ = ["Figures", "write_page"]

NAME = "hot-path"
DOORS = ("grpc", "http")
DOOR_NAMES = {"grpc": "gRPC door", "http": "HTTP door"}


@dataclass
class Figures:
    """One run's results (seconds unless named otherwise; per door where a dict)."""

    per_core: dict[str, float]
    tokens_per_second: dict[str, float]
    fairq_cores: dict[str, float]
    direct: tuple[float, float]
    added_p50: dict[str, float]
    added_p99: dict[str, float]
    loaded_p99: dict[str, float]
    loaded_cores: dict[str, float]
    loaded_streams: dict[str, int]
    replica_p50: dict[str, float]
    streams: int
    replicas: int
    load_average: tuple[float, float]
    rounds: tuple[int, int, int, float]


def _rows(fig: dict[str, Any] | None) -> list[float]:
    """The table's values of one run (NaN where absent), in :data:`_LABELS` order."""
    if fig is None:
        return [math.nan] * len(_LABELS)
    ms = 1000.0
    values: list[float] = []
    for door in DOORS:
        values += [
            fig["per_core"][door],
            fig["tokens_per_second"][door],
            fig["added_p50"][door] * ms,
            fig["added_p99"][door] * ms,
            fig["loaded_p99"][door] * ms,
            fig["replica_p50"][door] * ms,
        ]
    return [*values, fig["load_average"][0], fig["load_average"][1]]


_LABELS = [
    (f"{DOOR_NAMES[door]}: {what}", target)
    for door in DOORS
    for what, target in (
        ("tokens per fairq core-second", "≥ 60,000"),
        ("tokens/s relayed meanwhile (the load reached)", ""),
        ("added TTFT p50, low load (ms)", "≤ 0.5"),
        ("added TTFT p99, low load (ms)", "≤ 1"),
        ("added TTFT p99 at ~80 % of capacity (ms)", "≤ 2"),
        ("replica of three on Redis, p50 over one process (ms)", "≤ 0.5"),
    )
] + [("machine load average at the start (2 cores)", ""), ("... at the end", "")]


def write_page(out: Path, fig: Figures, *, quick: bool, as_before: bool, flames: list[str]) -> Path:
    """Write ``<out>/hot-path.md`` and ``<out>/hot-path.json``; return the page's path."""
    store = out / f"{NAME}.json"
    kept = json.loads(store.read_text()) if store.exists() else {}
    now = dataclasses.asdict(fig)
    before = now if as_before else kept.get("before")
    after = None if as_before else now
    store.write_text(json.dumps({"before": before, "after": after}, indent=1) + "\n")
    rows = [
        [label, target, b, a]
        for (label, target), b, a in zip(_LABELS, _rows(before), _rows(after), strict=True)
    ]
    detail = [
        [DOOR_NAMES[d], fig.streams, fig.tokens_per_second[d], fig.fairq_cores[d],
         fig.per_core[d], fig.loaded_streams[d], fig.loaded_cores[d]]
        for d in DOORS
    ]  # fmt: skip
    ms = 1000.0
    rounds, per_round, t_rounds, seconds = fig.rounds
    report = Report(NAME, "The hot path: tokens per fairq core-second, added time to first token")
    report.result = (
        f"{fig.per_core['grpc']:,.0f} (gRPC door) and {fig.per_core['http']:,.0f} (HTTP door) "
        "tokens per fairq core-second; added TTFT at low load "
        f"{fig.added_p50['grpc'] * ms:.2f} / {fig.added_p50['http'] * ms:.2f} ms p50, "
        f"{fig.added_p99['grpc'] * ms:.2f} / {fig.added_p99['http'] * ms:.2f} ms p99 "
        f"(gRPC / HTTP); a replica on Redis adds {fig.replica_p50['grpc'] * ms:.2f} / "
        f"{fig.replica_p50['http'] * ms:.2f} ms p50 over one process."
    )
    report.add(
        "Setup",
        f"""
A zero-cost backend of the benchmark's own (`fairq_bench.scenarios.firehose --first-now`):
one pre-encoded SSE event per token, the first at once, then one per stream every 10 ms as an
engine's steps. fairq (`fairq serve`, both doors, default settings but a gate threshold of
64 waiting requests, so that the gate does not pace the load) is pinned to one core; the
backend, Redis and the load generator to the other. fairq's cost is its own CPU time from
`/proc`; tokens are counted by the backend (every stream is read to its end).

- Throughput: {fig.streams} closed-loop streams of 200 tokens through one door at a time,
  {t_rounds} round(s) of {seconds:g} s per door after a 1 s ramp-up, the doors taking turns;
  the round with the median tokens per core-second is shown.
- Low load: two-token requests one at a time, {rounds} round(s) of {per_round} per path, the
  order of the paths rotating each request, after a warm-up; per round the p50 and p99 of
  each path minus those of straight to the backend (same HTTP client as the HTTP door; the
  gRPC door's figure includes the difference between the two clients), median over rounds.
  Straight to the backend: {fig.direct[0] * ms:.2f} ms p50, {fig.direct[1] * ms:.2f} ms p99.
- Loaded: each door with closed-loop streams sized to 80 % of the tokens per second it relayed
  under the throughput load (what the process did with the share of its core it got),
  probes alternating with direct ones.
- Redis: {fig.replicas} replica(s) with a `[cluster]` section on one redis-server, all on
  fairq's core; probes to one of them against the same probes to the process alone.

The machine is shared: its 1-minute load average was {fig.load_average[0]:.1f} at the start
and {fig.load_average[1]:.1f} at the end (2 cores), so the figures are ratios and medians taken
side by side in one run; absolute values move with that load.
""",
    )
    report.add(
        "Before and after",
        markdown_table(["", "target", "before", "after"], rows),
    )
    report.add(
        "This run's throughput and load",
        markdown_table(
            ["door", "streams", "tokens/s", "fairq cores", "tokens per core-second",
             "streams at 80 %", "fairq cores at 80 %"],
            detail,
        ),
    )  # fmt: skip
    graphs = sorted({*flames, *(p.name for p in out.glob(f"{NAME}-*.svg"))})
    if graphs:
        report.add(
            "Flame graphs",
            "py-spy (`--flame`), the lone fairq process under the throughput load:\n\n"
            + "\n".join(f"- [{g}]({g})" for g in graphs),
        )
    report.add(
        "Reproduce",
        "`uv run fairq bench hot-path` (add `--flame` for the flame graphs, `--as-before` to "
        "record the run as the before column, `--quick` for the CI guard). The before and "
        "after columns come from runs hours apart on a shared machine; to compare two "
        "versions side by side in one run (both on fairq's core, rounds interleaved, CPU per "
        "token above idle), `uv run python -m fairq_bench.hot_path.ab --before GIT_REF` "
        "(its figures for the latest changes are in `docs/design/hot-path.md`).",
    )
    return report.write(out, quick)
