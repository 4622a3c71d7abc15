"""Running one workload under several schedulers, and the figures every scenario reports."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from fairq_bench.report import percentile
from fairq_bench.scenarios.common import FairqSetup, SimSetup, run_direct, run_fairq
from fairq_bench.scenarios.plots import Series
from fairq_bench.scenarios.service import Ledger, chars_per_token
from fairq_bench.scenarios.tracing import Trace, scaled
from fairq_bench.workload import RequestSpec

__all__ = ["Run", "needs_sim", "output_tokens", "run_all", "share_series", "ttfts"]


@dataclass
class Run:
    """One scheduler's run of a workload; ``speed`` converts wall to simulated seconds."""

    label: str
    traces: list[Trace]
    speed: float
    duration: float
    weights: dict[str, float] | None = None
    probe: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.traces, weights=self.weights)

    def sim(self, wall: float) -> float:
        """Wall seconds to simulated seconds."""
        return wall * self.speed

    def wall(self, sim: float) -> float:
        """Simulated seconds to wall seconds."""
        return sim / self.speed

    def users(self, user: str | None = None) -> list[Trace]:
        """Traces of ``user`` (all if None)."""
        return [t for t in self.traces if user is None or t.spec.user == user]


def output_tokens(traces: Sequence[Trace], end: float | None = None) -> float:
    """Output tokens received (by wall time ``end`` if given)."""
    ratio = chars_per_token(traces)
    total = 0.0
    for t in traces:
        chars = t.chars
        if end is not None:
            chars = max((c for at, c in t.points if at <= end), default=0)
        if t.finished and t.chars and (end is None or (t.done or 0) <= end):
            total += t.spec.max_tokens
        else:
            total += min(chars / ratio, t.spec.max_tokens)
    return total


def ttfts(run: Run, traces: Sequence[Trace]) -> list[float]:
    """Simulated TTFTs; a request that never got a token counts until the end of the run."""
    return [run.sim(t.ttft(run.duration)) for t in traces if not t.error or t.first is not None]


def p(values: Sequence[float], q: float) -> float:
    """Percentile, NaN-safe."""
    return percentile(values, q) if values else math.nan


async def run_all(
    sim: SimSetup,
    specs_sim: Sequence[RequestSpec],
    setups: Sequence[tuple[str, FairqSetup | None]],
    duration_sim: float | None,
    weights: dict[str, float] | None = None,
    probe: Callable[[str], Awaitable[dict[str, float]]] | None = None,
) -> list[Run]:
    """Replay the same workload (times in simulated s) once per setup, each on a fresh sim.

    ``None`` as the setup means straight to the backend (its FIFO queue). Requests still open
    at ``duration_sim`` are cancelled (None: wait for all). ``probe(url)`` is awaited after
    each replay, before the simulator stops (to read its metrics).
    """
    specs = scaled(specs_sim, sim.speed)
    stop = duration_sim / sim.speed if duration_sim is not None else None
    runs = []
    for label, setup in setups:
        started = time.monotonic()
        async with sim.start() as url:
            if setup is None:
                traces = await run_direct(url, specs, stop)
            else:
                traces = await run_fairq(url, setup, specs, sim.speed, stop)
            probed = await probe(url) if probe is not None else {}
        wall = time.monotonic() - started
        errors = sum(1 for t in traces if t.error)
        print(f"  {label}: {len(traces)} requests, {errors} errors, {wall:.0f} s", flush=True)
        end = stop if stop is not None else max((t.done or 0.0) for t in traces)
        runs.append(Run(label, traces, sim.speed, end, weights, probed))
    return runs


def needs_sim(args: argparse.Namespace, name: str) -> bool:
    """True (and a message) when the scenario cannot run on the chosen backend."""
    if args.backend != "sim":
        print(f"  {name}: needs the simulator (--backend sim); skipped", flush=True)
        return True
    return False


def share_series(run: Run, user: str, width: float) -> Series:
    """``user``'s share of the service in ``run``, per window of ``width`` simulated seconds."""
    xs, ys = [], []
    k = 0
    while (k + 1) * width <= run.sim(run.duration) + 1e-9:
        shares = run.ledger.shares(run.wall(k * width), run.wall((k + 1) * width))
        xs.append((k + 0.5) * width)
        ys.append(shares[user])
        k += 1
    return Series(run.label, xs, ys, style="o-")
