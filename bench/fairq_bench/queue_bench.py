"""Micro-benchmark of the model queue: microseconds per push and per pop at 100k queued.

For each fairness policy x ordering policy, in one tier and spread over three tiers, it fills a
:class:`ModelQueue` with ``--queued`` requests from ``--users`` users, then measures a steady
state in which every step pops one request and pushes a new one, so the queue stays full:

- *push*: ``ModelQueue.push`` of a request from a uniformly random user;
- *pop*: ``first_tier`` + ``ModelQueue.pop`` + the token charge the dispatch causes
  (``charge`` with the request's prompt and output bound: VTC moves the counter, and
  the re-heap that follows is paid by the next pop; round-robin charges inside ``pop``);
- *grouped pop*: a prefix-grouping pick: ``candidates(Q, k)`` (k = the default
  ``prefix_candidates``, 8) then ``pop`` of a random candidate, plus the charge; Q is large
  enough that all k places fill (the costliest
  case). Its ``candidates()`` share is shown on its own, and so is ``head_of`` of every
  candidate, which the dispatcher adds on top to compare the candidates' prefixes.

The popped request's tier receives the new one, so every tier keeps its size. Each operation
is timed on its own with :func:`time.perf_counter`; the timer's own cost (printed) is
included, and so is any preemption by other processes: the CPU share printed per case says
how much of the wall time the benchmark actually ran, and each case is run ``--repeat``
times, keeping the run with the highest share (the least disturbed one). Run::

    uv run python -m fairq_bench.queue_bench            # the documented run
    uv run python -m fairq_bench.queue_bench --quick    # 10k queued, seconds

Tickets need a running event loop (they carry futures), so everything runs in ``asyncio.run``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fairq_server.backends.request import BackendRequest, Sampling
from fairq_server.config.schema import SchedulerConfig
from fairq_server.scheduling.interfaces import Cost
from fairq_server.scheduling.queue import ModelQueue
from fairq_server.scheduling.registry import make_fairness, make_ordering
from fairq_server.scheduling.ticket import Ticket

__all__ = ["Case", "Result", "main", "run_case"]

#: As the dispatcher compares by default (``[scheduler] prefix_candidates``).
CANDIDATES = SchedulerConfig().prefix_candidates
TARGET_US = 20.0
MAX_PROMPT = 2048
MAX_OUTPUT = 1024


@dataclass(frozen=True)
class Case:
    """One benchmark configuration."""

    fairness: str
    ordering: str
    tiers: int

    @property
    def quantum(self) -> float:
        """A Q that lets every backlogged user be a candidate (the costliest grouping)."""
        # Round-robin counters count requests; vtc counters count weighted tokens.
        return 1.0 if self.fairness == "round-robin" else float(MAX_PROMPT + 2 * MAX_OUTPUT)


@dataclass(frozen=True)
class Result:
    """Timings of one case: per-operation samples in microseconds, and CPU per step."""

    case: Case
    push: list[float]
    pop: list[float]
    grouped: list[float]
    candidates: list[float]  # the candidates() call of each grouped pop
    heads: list[float]  # head_of of every candidate, per grouped pop
    offered: float  # mean number of candidates per grouped pick
    cpu_plain: float  # process time per plain pop + push step, µs (preemption excluded)
    cpu_grouped: float  # process time per grouped pop + head_of + push step, µs
    cpu_share: float  # process time / wall time over the measured phases

    def _cells(self) -> list[str]:
        c = self.case
        return [c.fairness, c.ordering, str(c.tiers)]

    def target_row(self) -> list[str]:
        """Cells of the target table: mean and p99 of push, pop and grouped pop."""
        cells = self._cells()
        for samples in (self.push, self.pop, self.grouped):
            p99 = statistics.quantiles(samples, n=100)[98]
            cells += [f"{statistics.fmean(samples):.2f}", f"{p99:.2f}"]
        return cells

    def detail_row(self) -> list[str]:
        """Cells of the detail table: where grouped time goes, CPU time per step."""
        return [
            *self._cells(),
            f"{statistics.fmean(self.candidates):.2f}",
            f"{statistics.fmean(self.heads):.2f}",
            f"{self.offered:.1f}",
            f"{self.cpu_plain:.2f}",
            f"{self.cpu_grouped:.2f}",
            f"{self.cpu_share:.0%}",
        ]

    def worst_mean(self) -> float:
        """The largest mean of the three measured operations."""
        return max(statistics.fmean(x) for x in (self.push, self.pop, self.grouped))


CASE_HEADER = ["fairness", "ordering", "tiers"]
TARGET_HEADER = [
    *CASE_HEADER,
    "push µs",
    "push p99",
    "pop µs",
    "pop p99",
    "grouped pop µs",
    "grouped p99",
]
DETAIL_HEADER = [
    *CASE_HEADER,
    "candidates() µs",
    "head_of x k µs",
    "k",
    "CPU µs / plain step",
    "CPU µs / grouped step",
    "CPU share",
]


def make_tickets(n: int, users: int, rng: random.Random) -> list[Ticket]:
    """``n`` requests from ``users`` users with random prompt and output lengths."""
    request = BackendRequest(model="bench", prompt="x", sampling=Sampling(max_tokens=1))
    return [
        Ticket(
            request=request,
            user=f"user-{rng.randrange(users)}",
            tier=0,
            prompt_tokens=rng.randint(16, MAX_PROMPT),
            max_tokens=rng.randint(16, MAX_OUTPUT),
        )
        for _ in range(n)
    ]


def run_case(
    case: Case, fill: Sequence[Ticket], fresh: Sequence[Ticket], steps: int, seed: int
) -> Result:
    """Fill a queue with ``fill``, then time ``steps`` pop/push pairs, plain and grouped.

    ``fresh`` supplies the pushed tickets (2 * ``steps`` of them). Tickets are reused across
    cases: only their tier is rewritten, which a fresh queue does not mind.
    """
    rng = random.Random(seed)
    for t in fill:
        t.tier = rng.randrange(case.tiers)
    q = ModelQueue(case.tiers, lambda: make_fairness(case.fairness), make_ordering(case.ordering))
    for t in fill:
        q.push(t)
    picks = [rng.randrange(CANDIDATES) for _ in range(steps)]
    perf = time.perf_counter
    push: list[float] = []
    pop: list[float] = []
    grouped: list[float] = []
    cands: list[float] = []
    heads: list[float] = []
    offered = 0
    gc.collect()

    def pop_plain() -> int:
        t0 = perf()
        tier = q.first_tier()
        assert tier is not None
        t = q.pop(tier)
        q.tiers[tier].fairness.charge(
            t.user, Cost(prompt_tokens=t.prompt_tokens, completion_tokens=t.max_tokens)
        )
        pop.append(perf() - t0)
        return tier

    def pop_grouped(i: int) -> int:
        nonlocal offered
        t0 = perf()
        tier = q.first_tier()
        assert tier is not None
        tq = q.tiers[tier]
        users = tq.fairness.candidates(case.quantum, CANDIDATES)
        t1 = perf()
        t = q.pop(tier, users[picks[i] % len(users)])
        tq.fairness.charge(
            t.user, Cost(prompt_tokens=t.prompt_tokens, completion_tokens=t.max_tokens)
        )
        t2 = perf()
        grouped.append(t2 - t0)
        cands.append(t1 - t0)
        offered += len(users)
        # What the dispatcher reads to compare prefixes; timed apart from the queue's work.
        users = [u for u in users if tq.user_len(u)]
        t3 = perf()
        for user in users:
            tq.head_of(user)
        heads.append(perf() - t3)
        return tier

    def push_one(t: Ticket, tier: int) -> None:
        t.tier = tier
        t0 = perf()
        q.push(t)
        push.append(perf() - t0)

    wall, cpu = perf(), time.process_time()
    for i in range(steps):
        push_one(fresh[i], pop_plain())
    cpu_mid = time.process_time()
    for i in range(steps):
        push_one(fresh[steps + i], pop_grouped(i))
    cpu_end = time.process_time()
    share = (cpu_end - cpu) / (perf() - wall)
    assert len(q) == len(fill)
    us = 1e6
    return Result(
        case,
        push=[x * us for x in push],
        pop=[x * us for x in pop],
        grouped=[x * us for x in grouped],
        candidates=[x * us for x in cands],
        heads=[x * us for x in heads],
        offered=offered / steps,
        cpu_plain=(cpu_mid - cpu) / steps * us,
        cpu_grouped=(cpu_end - cpu_mid) / steps * us,
        cpu_share=share,
    )


def timer_overhead_us(n: int = 100_000) -> float:
    """Mean cost of the two perf_counter calls around each timed operation."""
    perf = time.perf_counter
    samples = []
    for _ in range(n):
        t0 = perf()
        samples.append(perf() - t0)
    return statistics.fmean(samples) * 1e6


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


async def _run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    fill = make_tickets(args.queued, args.users, rng)
    fresh = make_tickets(2 * args.steps, args.users, rng)
    cases = [
        Case(fairness, ordering, tiers)
        for tiers in (1, 3)
        for fairness in ("round-robin", "vtc")
        for ordering in ("fifo", "shortest-first")
    ]
    print(
        f"{args.queued} queued from {args.users} users, {args.steps} steady-state steps per "
        f"phase, best of {args.repeat} by CPU share, timer overhead {timer_overhead_us():.2f} µs "
        "(included)",
        flush=True,
    )
    results = []
    for i, case in enumerate(cases):
        runs = [run_case(case, fill, fresh, args.steps, args.seed + i) for _ in range(args.repeat)]
        result = max(runs, key=lambda r: r.cpu_share)
        results.append(result)
        print(" ".join(result.target_row()), "|", " ".join(result.detail_row()[3:]), flush=True)
    print()
    print(markdown(TARGET_HEADER, [r.target_row() for r in results]))
    print()
    print(markdown(DETAIL_HEADER, [r.detail_row() for r in results]))
    worst = max(r.worst_mean() for r in results)
    verdict = "met" if worst <= TARGET_US else "MISSED"
    print(f"\nworst mean {worst:.2f} µs per operation; target {TARGET_US:g} µs: {verdict}")
    return 0 if worst <= TARGET_US else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status 1 if a mean exceeds the 20 µs target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queued", type=int, default=100_000, help="requests kept queued")
    parser.add_argument("--users", type=int, default=10_000, help="distinct users")
    parser.add_argument("--steps", type=int, default=50_000, help="pop/push pairs per phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per case; the least preempted one is kept"
    )
    parser.add_argument(
        "--quick", action="store_true", help="10k queued from 1k users, 5k steps (a smoke run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.queued, args.users, args.steps, args.repeat = 10_000, 1_000, 5_000, 1
    return asyncio.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())
