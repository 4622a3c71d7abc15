"""A hard tokens-per-minute quota held across three replicas, and what it costs per request.

One user sends from three replicas at once, each keeping ``SLOTS`` requests going, for
``MINUTES`` minutes, against a hard quota of ``QUOTA`` tokens per rolling minute. Each request
reserves its most (``PROMPT + MAX_TOKENS``) at dispatch and settles at its end with what it
used (a prompt plus ``MAX_TOKENS / 5 .. MAX_TOKENS`` output tokens, at ``TOKENS_PER_SECOND``).
A refused request waits the ``retry_after`` it was given and asks again. Twice:

- **shared**: the three replicas' books are :class:`~fairq_server.tenancy.books.redis.
  RedisBook` on one real ``redis-server`` (what a cluster uses);
- **uncoordinated**: each replica has its own one-process
  :class:`~fairq_server.tenancy.books.local.LocalBook` (what a per-replica check gives).

The books are driven directly on a clock running ``SPEEDUP`` times faster than real time
(Redis's windows are moved with the book's clock offset, so Redis's clock still decides), so
three minutes take seconds. Reported: the tokens counted in every rolling minute (each request
by its grant time, at its settled amount), which must stay within ``QUOTA`` plus one
request's reservation when shared.

In full runs (not ``--quick``), the same through real processes: see the section below.

Then the cost on the request path against the same Redis: a reservation (two keys) and a
settlement alone, the slot claim alone, the claim and the reservation in one round trip (as a
cluster sends them), and one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio.connection import AbstractConnection

from fairq_bench.redis_process import RedisProcess
from fairq_bench.report import markdown_table, percentile
from fairq_bench.scenarios.docs import RESULT_PREFIX
from fairq_bench.scenarios.quota_cluster import run_quota_cluster
from fairq_bench.scenarios.quota_cluster_report import cluster_plot, cluster_section
from fairq_server.cluster.connection import connect
from fairq_server.cluster.shared_gate import SharedGate
from fairq_server.config.cluster import ClusterConfig
from fairq_server.tenancy.books.book import (
    Grant,
    LimitBook,
    LimitKey,
    LimitUse,
    Measure,
    Refusal,
    Scope,
    Window,
)
from fairq_server.tenancy.books.local import LocalBook
from fairq_server.tenancy.books.redis import RedisBook

__all__ = ["quota_replicas"]

QUOTA = 20_000.0
PROMPT, MAX_TOKENS = 200, 500
RESERVED = PROMPT + MAX_TOKENS
TOKENS_PER_SECOND = 50.0
REPLICAS, SLOTS = 3, 4
MINUTES = 3
KEY = LimitKey(Scope.USER, "ann", None, Measure.TOKENS, Window.MINUTE)
DAY = LimitKey(Scope.USER, "ann", None, Measure.TOKENS, Window.DAY)


@dataclass
class Run:
    """One run's requests: (virtual grant time, settled tokens), and refusals."""

    name: str
    granted: list[tuple[float, float]] = field(default_factory=list)
    refusals: int = 0

    def per_second(self, seconds: int) -> list[float]:
        counted = [0.0] * (seconds + 1)
        for at, tokens in self.granted:
            counted[min(int(at), seconds)] += tokens
        return counted

    def rolling(self, seconds: int) -> list[float]:
        """Tokens counted in the minute ending at each second."""
        counted = self.per_second(seconds)
        return [sum(counted[max(0, s - 59) : s + 1]) for s in range(seconds + 1)]

    def per_minute(self, seconds: int) -> list[float]:
        counted = self.per_second(seconds)
        return [sum(counted[m * 60 : (m + 1) * 60]) for m in range(seconds // 60)]


async def _drive(
    books: list[LimitBook],
    name: str,
    speedup: float,
    seconds: int,
    set_clock: Callable[[float], None],
    start: float | None = None,
) -> Run:
    """Three replicas' slots asking their books for ``seconds`` of virtual time from ``start``."""
    run = Run(name)
    rng = random.Random(7)
    began = time.monotonic() if start is None else start

    def now() -> float:
        return (time.monotonic() - began) * speedup

    async def slot(book: LimitBook) -> None:
        while (at := now()) < seconds:
            set_clock(at)
            outcome = await book.reserve(
                [LimitUse(KEY, RESERVED, QUOTA), LimitUse(DAY, RESERVED, 1e12)], at
            )
            if isinstance(outcome, Refusal):
                run.refusals += 1
                await asyncio.sleep(max(outcome.retry_after, 0.05) / speedup)
                continue
            output = rng.randint(MAX_TOKENS // 5, MAX_TOKENS)
            await asyncio.sleep(output / TOKENS_PER_SECOND / speedup)
            set_clock(now())
            await book.settle(outcome, [PROMPT + output, PROMPT + output])
            run.granted.append((at, float(PROMPT + output)))

    await asyncio.gather(*(slot(book) for book in books for _ in range(SLOTS)))
    return run


class _Writes:
    """Counts writes to Redis connections: one per round trip (a pipeline is one write)."""

    def __init__(self) -> None:
        self.count = 0
        self._original: Any = None

    def __enter__(self) -> _Writes:
        self._original = original = AbstractConnection.send_packed_command

        async def counting(conn: AbstractConnection, *args: Any, **kwargs: Any) -> None:
            self.count += 1
            await original(conn, *args, **kwargs)

        AbstractConnection.send_packed_command = counting  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]


async def _costs(url: str, count: int) -> list[tuple[str, float, float, float]]:
    """p50 and p99 (ms) and round trips of each Redis step a cluster's request takes.

    The steps take turns (one of each per round), so the machine's load weighs on all alike.
    """
    client = connect(ClusterConfig(url, replica_id="cost"))
    try:
        gate = SharedGate(client, "cost", lease_seconds=5.0)
        book = RedisBook(client, "cost", LocalBook())
        uses = [LimitUse(KEY, 1.0, 1e12), LimitUse(DAY, 1.0, 1e12)]
        members = iter(range(10**9))
        grant = await book.reserve(uses, time.time())
        assert isinstance(grant, Grant)

        async def joined() -> None:
            call, read = book.reserve_call(uses)
            _, replies = await gate.claim("sim", f"c|{next(members)}", [call])
            read(replies[0])

        async def one_then_other() -> None:
            await gate.claim("sim", f"c|{next(members)}")
            await book.reserve(uses, time.time())

        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("reservation alone (2 keys)", lambda: book.reserve(uses, time.time())),
            ("settlement alone", lambda: book.settle(grant, [1.0, 1.0])),
            ("slot claim alone (what a cluster pays today)",
             lambda: gate.claim("sim", f"c|{next(members)}")),
            ("slot claim + reservation, one round trip", joined),
            ("slot claim, then reservation", one_then_other),
        ]  # fmt: skip
        for _, step in steps:  # warm: connection open, scripts loaded
            await step()
        took: list[list[float]] = [[] for _ in steps]
        writes = [0] * len(steps)
        for _ in range(count):
            for i, (_, step) in enumerate(steps):
                with _Writes() as counted:
                    started = time.perf_counter()
                    await step()
                    took[i].append((time.perf_counter() - started) * 1000)
                writes[i] += counted.count
        return [
            (label, percentile(t, 50), percentile(t, 99), w / count)
            for (label, _), t, w in zip(steps, took, writes, strict=True)
        ]
    finally:
        await client.aclose()


def _plot(runs: list[Run], seconds: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    xs = list(range(seconds + 1))
    for run in runs:
        ax.plot(xs, run.rolling(seconds), label=run.name)
    ax.axhline(QUOTA, color="black", linewidth=0.8, linestyle="--", label=f"quota {QUOTA:g}")
    ax.axhline(
        QUOTA + RESERVED, color="red", linewidth=0.8, linestyle=":", label="quota + one request"
    )
    ax.set_xlabel("seconds (virtual)")
    ax.set_ylabel("tokens in the last 60 s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.suptitle(f"One user, {REPLICAS} replicas, hard quota {QUOTA:g} tokens/minute")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def quota_replicas(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Scenario ``quota-replicas``: shared vs uncoordinated books, then the cost per request."""
    speedup = 18.0 if args.quick else 4.0
    seconds = MINUTES * 60
    with RedisProcess.running() as redis:
        config = ClusterConfig(redis.url, replica_id="bench")
        clients = [connect(config) for _ in range(REPLICAS)]
        shared = [RedisBook(c, "q", LocalBook()) for c in clients]
        shared_books: list[LimitBook] = list(shared)
        seconds_now, micros = await clients[0].time()
        started_ms = int(seconds_now) * 1000 + int(micros) // 1000
        # Redis's clock plus the offset is the virtual clock, virtual second 0 on a whole
        # Redis second: started_ms - started_ms % 1000 + at.
        began = time.monotonic()

        def set_offset(at: float) -> None:
            elapsed_ms = (time.monotonic() - began) * 1000
            offset = round(at * 1000 - elapsed_ms) - started_ms % 1000
            for book in shared:
                book.clock_offset_ms = offset

        try:
            runs = [
                await _drive(shared_books, "shared (Redis)", speedup, seconds, set_offset, began)
            ]
        finally:
            for client in clients:
                await client.aclose()
        alone: list[LimitBook] = [LocalBook() for _ in range(REPLICAS)]
        runs.append(
            await _drive(
                # No Redis clock to follow: twice as fast (the same virtual minutes).
                alone,
                "uncoordinated (one book per replica)",
                2 * speedup,
                seconds,
                lambda at: None,
            )
        )
        costs = await _costs(redis.url, 100 if args.quick else 1000)
    _plot(runs, seconds, out / "quota-replicas.png")
    cluster, cluster_result, cluster_ok = "", "", True
    if not args.quick:  # real processes and real minutes: over 4 minutes, too long for CI
        real, soft = await run_quota_cluster()
        cluster_plot(real, soft, out / "quota-replicas-cluster.png")
        cluster, cluster_result, cluster_ok = cluster_section(real, soft)
        cluster += "\n![tokens per minute, real replicas; the soft user's share]"
        cluster += "(quota-replicas-cluster.png)\n\n"
        cluster_result = f"; {cluster_result}"
    peaks = {run.name: max(run.rolling(seconds)) for run in runs}
    shared_ok = peaks[runs[0].name] <= QUOTA + RESERVED
    rows = [
        [run.name, *(f"{v:,.0f}" for v in run.per_minute(seconds)), f"{peaks[run.name]:,.0f}",
         f"{peaks[run.name] / QUOTA:.2f}x", len(run.granted), run.refusals]
        for run in runs
    ]  # fmt: skip
    header = ["books", *(f"minute {m + 1}" for m in range(MINUTES)), "most in any rolling minute",
              "of the quota", "requests", "refusals"]  # fmt: skip
    cost_rows = [
        [label, f"{p50:.3f}", f"{p99:.3f}", f"{trips:g}"] for label, p50, p99, trips in costs
    ]
    joined, claim = costs[3], costs[2]
    result = (
        f"one user from {REPLICAS} replicas against a hard quota of {QUOTA:,.0f} tokens/minute: "
        f"at most {peaks[runs[0].name]:,.0f} tokens in any rolling minute with the shared book "
        f"(bound: quota + one request = {QUOTA + RESERVED:,.0f}), "
        f"{peaks[runs[1].name]:,.0f} ({peaks[runs[1].name] / QUOTA:.1f}x) with one book per "
        f"replica; the reservation riding in the slot claim's round trip keeps it at "
        f"{joined[3]:g} round trip ({claim[3]:g} for the claim alone), p50 {joined[1]:.3f} ms "
        f"vs {claim[1]:.3f} ms{cluster_result}"
    )
    page = (
        "# Quotas across replicas\n\n"
        + (__doc__ or "").split("\n\n", 1)[1]
        + f"\nHere: {REPLICAS} replicas x {SLOTS} slots, quota {QUOTA:g} tokens/minute, "
        f"requests of {PROMPT} prompt + up to {MAX_TOKENS} output tokens (reserved: "
        f"{RESERVED}), {MINUTES} virtual minutes at {speedup:g}x.\n\n"
        + markdown_table(header, rows)
        + "\n\n![tokens in the last minute, shared and uncoordinated](quota-replicas.png)\n\n"
        + cluster
        + "## Cost on the request path (ms, loopback Redis)\n\n"
        + markdown_table(["step", "p50", "p99", "round trips"], cost_rows)
        + "\n\nRound trips are writes to the Redis connection (a pipeline is one). The times "
        "are on loopback, on a machine shared with other work: the script's own time "
        "dominates, and the round trip saved is what a network between fairq and Redis adds."
        + f"\n\n{RESULT_PREFIX} {result}.\n\n"
        + "Reproduce: `uv run fairq bench quota-replicas --write-docs` (`--quick`: 18x clock, "
        "and without the real processes: their part needs three real minutes and more).\n"
    )
    (out / "quota-replicas.md").write_text(page)
    print(page, flush=True)
    return shared_ok and peaks[runs[1].name] >= 2 * QUOTA and cluster_ok
