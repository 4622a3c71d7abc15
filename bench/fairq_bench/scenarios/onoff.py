"""Scenario 7, on/off user: idle time cannot be banked and spent later in a burst.

User A is backlogged throughout. User B is backlogged, goes idle, and comes back backlogged.
With vtc's lift, B returns at the smallest active counter and shares the backend equally
with A at once. The baseline ``vtc-no-lift`` (``[scheduler] fairness = "vtc"`` with the
option ``lift = false``, plain configuration never meant outside a benchmark) keeps B's old,
low counter: B then takes the whole backend until it has "caught up" with the
service A received while B was away, and A starves.
"""

from __future__ import annotations

import argparse
import itertools
import random
from pathlib import Path

from fairq_bench.report import markdown_table
from fairq_bench.scenarios.common import FairqSetup, SimSetup, Tier
from fairq_bench.scenarios.docs import Report
from fairq_bench.scenarios.plots import Panel, plot_panels
from fairq_bench.scenarios.runs import needs_sim, run_all, share_series
from fairq_bench.scenarios.workloads import arrivals, prompt_text
from fairq_bench.workload import RequestSpec

__all__ = ["on_off"]

NAME = "on-off"
SEED = 5
A, B = "A-always", "B-on-off"


def workload(on1: float, off: float, on2: float) -> list[RequestSpec]:
    """A sends 3 req/s throughout; B sends 3 req/s in [0, on1) and [on1 + off, end)."""
    rng = random.Random(SEED)
    end = on1 + off + on2
    specs = []
    for user, spans in ((A, [(0.0, end)]), (B, [(0.0, on1), (on1 + off, end)])):
        i = 0
        for start, stop in spans:
            for at in arrivals(rng, 3.0, start, stop):
                specs.append(RequestSpec(user, prompt_text(256, f"{user}#{i}"), 256, at=at))
                i += 1
    return specs


async def on_off(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run scenario 7; True if B's share after its return stays near an equal split."""
    if needs_sim(args, NAME):
        return True
    quick = args.quick
    sim = SimSetup("llama-8b-gpu", max_num_seqs=11, speed=4.0)
    on1, off, on2 = (20.0, 30.0, 30.0) if quick else (40.0, 80.0, 60.0)
    duration = on1 + off + on2
    back = on1 + off
    tiers = (Tier("standard"),)
    setups: list[tuple[str, FairqSetup | None]] = [("vtc (lift)", FairqSetup("vtc", tiers))]
    if not quick:
        setups.append(
            (
                "vtc-no-lift (baseline)",
                FairqSetup("vtc", tiers, scheduler={"fairness_options": "{ lift = false }"}),
            )
        )
        setups.append(("FIFO (direct)", None))
    runs = await run_all(sim, workload(on1, off, on2), setups, duration)

    rows: list[list[object]] = []
    window = 20.0
    results = {}
    for run in runs:
        first = run.ledger.shares(run.wall(back), run.wall(back + window))[B]
        whole = run.ledger.shares(run.wall(back), run.duration)[B]
        # A's longest stretch without a new request starting after B's return: what the
        # banked credit costs A (A's TTFTs say little, A being backlogged throughout).
        starts = sorted(run.sim(t.first) for t in run.users(A) if t.first is not None)
        edges = [back, *(x for x in starts if x >= back), duration]
        gap = max(b - a for a, b in itertools.pairwise(edges))
        results[run.label] = (first, whole, gap)
        rows.append([run.label, f"{first:.0%}", f"{whole:.0%}", gap])
    header = [
        "scheduler", f"B's share, first {window:g} s back", "B's share, whole return",
        "A's longest wait for a start after B's return (s)",
    ]  # fmt: skip
    lift = results["vtc (lift)"]
    ok = abs(lift[0] - 0.5) <= 0.15 and abs(lift[1] - 0.5) <= 0.1
    if not quick:
        ok = ok and results["vtc-no-lift (baseline)"][0] > lift[0] + 0.2

    plot_panels(
        out / f"{NAME}.png",
        [
            Panel(
                "B's share of service per 10 s window",
                [share_series(r, B, 10.0) for r in runs],
                ylabel="B share of (prompt + 2 x output)",
                hlines=((0.5, "equal"),),
            )
        ],
        f"On/off user: B idle from {on1:g} s to {back:g} s",
    )
    report = Report(NAME, "On/off user: the lift stops banked idle time")
    report.result = (
        f"after {off:g} s idle, the returning user gets {lift[0]:.0%} of the service in its "
        f"first {window:g} s back under vtc"
        + (
            f", {results['vtc-no-lift (baseline)'][0]:.0%} without the lift (the always-on "
            f"user waits up to {lift[2]:.1f} s vs {results['vtc-no-lift (baseline)'][2]:.1f} s "
            "for a request to start)"
            if not quick
            else ""
        )
        + "."
    )
    report.add(
        "Setup",
        f"""
Simulated vLLM, profile `{sim.profile}`, `--max-num-seqs {sim.max_num_seqs}` (~
{sim.capacity(256, 256):.1f} requests/s of 256+256 tokens), speed {sim.speed:g}x, times in
simulated seconds, seed {SEED}. A sends 3 requests/s (Poisson, 256 in / 256 out) for the
whole {duration:g} s; B the same in [0, {on1:g}) and [{back:g}, {duration:g}), nothing in
between. Both are backlogged whenever they send. `vtc-no-lift` is vtc with the lift removed
(`[scheduler.fairness_options] lift = false`, a baseline for this benchmark only): a
returning user keeps its old counter.
""",
    )
    report.add("Results", markdown_table(header, rows))
    report.add("Plot", f"![B's share over time]({NAME}.png)")
    report.add(
        "What it shows",
        """
While B is away A gets the whole backend, and its counter runs far ahead of B's. With the
lift, B's counter is raised to A's when it returns, so the two split the backend from the
first window on. Without it, B's old counter is the smallest by a wide margin, so B gets
nearly everything until it has consumed what A got in its absence, and A's requests wait
that long. FIFO is shown for reference: B's new requests queue inside the backend behind
A's whole backlog, so B gets nothing at all while it lasts.
""",
    )
    report.add(
        "Reproduce", f"`uv run fairq bench on-off --backend sim{' --quick' if quick else ''}`"
    )
    report.write(out, quick)
    print(markdown_table(header, rows), flush=True)
    return ok
