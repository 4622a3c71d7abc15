"""Skewed ingress under vtc: a heavy user on replica 0, three others on replicas 1 and 2.

Every user keeps the same number of requests outstanding for the whole run (all
backlogged), so one fair scheduler gives each a quarter of the tokens. Without shared
counters each replica serves its own users as the shared backend admits them: replica 0's
one user gets about a third. The reference is one replica serving all four users (the
single-replica vtc bound, as measured). Measured: Jain's index of per-user tokens over
windows, and the accumulated service gap (largest minus smallest per-user tokens) over time.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from pathlib import Path

from fairq_bench.cluster.setup import running_cluster
from fairq_bench.report import markdown_table
from fairq_bench.workload import RequestSpec, SendFn

__all__ = ["FairnessResult", "fairness_markdown", "jain", "run_fairness"]

USERS = {"heavy": 0, "light-1": 1, "light-2": 1, "light-3": 2}
TOKENS = 60
OUTSTANDING = 4
ERRORS: collections.Counter[str] = collections.Counter()


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one has everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


@dataclass(frozen=True)
class Run:
    """Completions of one run: (seconds from start, user, tokens)."""

    label: str
    done: list[tuple[float, str, int]]
    seconds: float

    def windows(self, window: float) -> list[float]:
        """Jain's index per full window."""
        out = []
        start = 0.0
        while start + window <= self.seconds + 1e-9:
            tokens = {u: 0.0 for u in USERS}
            for t, user, n in self.done:
                if start <= t < start + window:
                    tokens[user] += n
            out.append(jain(list(tokens.values())))
            start += window
        return out

    def shares(self) -> dict[str, float]:
        """Each user's share of all tokens served."""
        tokens = {u: 0.0 for u in USERS}
        for _, user, n in self.done:
            tokens[user] += n
        total = sum(tokens.values()) or 1.0
        return {u: v / total for u, v in tokens.items()}

    def gap(self, step: float = 1.0) -> list[tuple[float, float]]:
        """(time, largest minus smallest accumulated tokens) every ``step`` seconds."""
        out = []
        t = step
        while t <= self.seconds + 1e-9:
            acc = {u: 0.0 for u in USERS}
            for d, user, n in self.done:
                if d < t:
                    acc[user] += n
            out.append((t, max(acc.values()) - min(acc.values())))
            t += step
        return out


@dataclass(frozen=True)
class FairnessResult:
    """The reference (one replica), the uncoordinated replicas and the shared counters."""

    runs: tuple[Run, ...]
    window: float


async def _user(
    send: SendFn, user: str, until: float, start: float, out: list[tuple[float, str, int]]
) -> None:
    i = 0
    while time.monotonic() < until:
        spec = RequestSpec(user, f"{user} request {i}", TOKENS)
        i += 1
        try:
            async for _ in send(spec):
                pass
        except Exception as exc:  # counted, and the user goes on (a fault run may cause it)
            ERRORS[type(exc).__name__ + ": " + str(exc)[:120]] += 1
            await asyncio.sleep(0.05)
            continue
        if time.monotonic() <= until:
            out.append((time.monotonic() - start, user, TOKENS))


async def _run(label: str, replicas: int, coordinated: bool, seconds: float) -> Run:
    async with running_cluster(replicas, coordinated, max_num_seqs=4, fairness="vtc") as cluster:
        done: list[tuple[float, str, int]] = []
        start = time.monotonic()
        until = start + seconds
        await asyncio.gather(
            *(
                _user(cluster.senders[replica % replicas], user, until, start, done)
                for user, replica in USERS.items()
                for _ in range(OUTSTANDING)
            )
        )
    run = Run(label, done, seconds)
    print(f"  {label}: shares {run.shares()}", flush=True)
    return run


async def run_fairness(seconds: float, window: float, plot: Path | None = None) -> FairnessResult:
    """Run the reference, the baseline and the shared counters; plot the service gaps."""
    runs = (
        await _run("one replica (reference)", 1, False, seconds),
        await _run("replicas alone", 3, False, seconds),
        await _run("shared counters", 3, True, seconds),
    )
    result = FairnessResult(runs, window)
    if plot is not None:
        _plot(result, plot)
    return result


def _plot(result: FairnessResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in result.runs:
        points = run.gap()
        ax.plot([t for t, _ in points], [g for _, g in points], label=run.label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("accumulated service gap (tokens, max - min user)")
    ax.set_title("Skewed ingress, vtc: heavy user on replica 0, three others on 1 and 2")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fairness_markdown(result: FairnessResult) -> str:
    """Shares, Jain per window and the final service gap, baseline vs shared."""
    rows = []
    for run in result.runs:
        shares = run.shares()
        windows = run.windows(result.window)
        gap = run.gap()
        rows.append(
            (
                run.label,
                " / ".join(f"{shares[u]:.2f}" for u in USERS),
                ", ".join(f"{j:.3f}" for j in windows) or "-",
                " / ".join(
                    f"{v:.0f}"
                    for v in (
                        sum(g for _, g in gap) / len(gap),
                        max(g for _, g in gap),
                        gap[-1][1],
                    )
                )
                if gap
                else "-",
            )
        )
    # The gap moves by whole requests as they complete: its mean and largest value over the
    # run say more than its value at one instant.
    header = ("run", "token share heavy / light-1 / light-2 / light-3 (fair: 0.25 each)",
              f"Jain per {result.window:g} s window",
              "service gap, mean / largest / at the end (tokens, every second)")  # fmt: skip
    return markdown_table(header, rows)
