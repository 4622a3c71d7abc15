"""Scenario 2, backlogged overload: FIFO vs round-robin vs vtc under ~1.5x load.

Two workloads, after the VTC paper's synthetic experiments (Sheng et al., OSDI 2024):

- *two users*: Poisson arrivals at 1.5 and 3 requests/s, 256 prompt and 256 output tokens
  each, on a backend that completes about 2.9 requests/s (1.56x overload);
- *eight users*: ShareGPT-like lengths, rates in proportion 8:4:2:2:1:1:1:1 (two of them
  bursty, Gamma gaps with CV 2), 1.5x the backend's capacity in total.

Figures: accumulated service difference between the two users over time, and Jain's index of
normalized service (see :mod:`.service`) over 60-second windows.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from fairq_bench.report import markdown_table
from fairq_bench.scenarios.common import FairqSetup, SimSetup, Tier
from fairq_bench.scenarios.docs import Report
from fairq_bench.scenarios.plots import Panel, Series, plot_panels
from fairq_bench.scenarios.runs import Run, needs_sim, output_tokens, p, run_all, ttfts
from fairq_bench.scenarios.workloads import CHAT, arrivals, prompt_text, user_stream
from fairq_bench.workload import RequestSpec

__all__ = ["overload"]

SEED = 2024
NAME = "overload"


def _sim(quick: bool) -> SimSetup:
    return SimSetup("llama-8b-gpu", max_num_seqs=11, speed=4.0 if quick else 3.0)


def _setups(quick: bool) -> list[tuple[str, FairqSetup | None]]:
    tiers = (Tier("standard", max_backend_waiting=3),)
    out: list[tuple[str, FairqSetup | None]] = [("FIFO (direct)", None)]
    if not quick:
        out.append(("round-robin", FairqSetup("round-robin", tiers)))
    out.append(("vtc", FairqSetup("vtc", tiers)))
    return out


def two_users(duration: float) -> list[RequestSpec]:
    """User A at 1.5 req/s, user B at 3 req/s, 256 in / 256 out (simulated seconds)."""
    rng = random.Random(SEED)
    specs = []
    for user, rate in (("A-1.5rps", 1.5), ("B-3rps", 3.0)):
        for i, at in enumerate(arrivals(rng, rate, 0.0, duration)):
            specs.append(RequestSpec(user, prompt_text(256, f"{user}#{i}"), 256, at=at))
    return specs


def eight_users(duration: float, sim: SimSetup) -> list[RequestSpec]:
    """Eight ShareGPT-like users at 1.5x capacity, rates 8:4:2:2:1:1:1:1."""
    rng = random.Random(SEED + 8)
    shares = [8, 4, 2, 2, 1, 1, 1, 1]
    total = 1.5 * sim.capacity(*CHAT.mean())
    specs: list[RequestSpec] = []
    for i, share in enumerate(shares):
        cv = 2.0 if i in (2, 3) else 1.0  # two bursty users
        rate = total * share / sum(shares)
        user = f"u{i}-x{share}"
        specs += user_stream(rng, user, CHAT, arrivals(rng, rate, 0.0, duration, cv))
    return specs


def _window_rows(runs: list[Run], width: float, warmup: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for run in runs:
        wins = run.ledger.windows(run.wall(warmup), run.duration, run.wall(width))
        values = [j for _, j in wins]
        rows.append([run.label, *[f"{v:.3f}" for v in values]])
    return rows


def _jains(run: Run, width: float, warmup: float) -> list[float]:
    return [j for _, j in run.ledger.windows(run.wall(warmup), run.duration, run.wall(width))]


def _diff_curve(run: Run, a: str, b: str, points: int = 120) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for k in range(points + 1):
        t = run.duration * k / points
        xs.append(run.sim(t))
        ys.append(run.ledger.served(b, t) - run.ledger.served(a, t))
    return xs, ys


async def overload(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run scenario 2; True if vtc keeps service equal where FIFO does not."""
    if needs_sim(args, NAME):
        return True
    quick = args.quick
    sim = _sim(quick)
    width = 20.0 if quick else 60.0
    warmup = 10.0
    t2 = 60.0 if quick else 240.0
    cap2 = sim.capacity(256, 256)
    print(f"  two users, capacity ~{cap2:.2f} req/s, offered 4.5 req/s", flush=True)
    runs2 = await run_all(sim, two_users(t2), _setups(quick), t2)

    a, b = "A-1.5rps", "B-3rps"
    rows = []
    for run in runs2:
        end = run.duration
        diff = run.ledger.served(b, end) - run.ledger.served(a, end)
        total = run.ledger.served(a, end) + run.ledger.served(b, end)
        jains = _jains(run, width, warmup)
        rows.append([
            run.label,
            output_tokens(run.traces) / run.sim(end),
            run.ledger.served(a, end) / run.sim(end),
            run.ledger.served(b, end) / run.sim(end),
            diff, diff / total if total else 0.0,
            min(jains), sum(jains) / len(jains),
            p(ttfts(run, run.users(a)), 50), p(ttfts(run, run.users(a)), 99),
        ])  # fmt: skip
    header2 = [
        "scheduler", "output tok/s", "A service/s", "B service/s", "B-A service at end",
        "(B-A)/total", f"Jain min ({width:g} s)", "Jain mean", "A TTFT p50 (s)", "A TTFT p99 (s)",
    ]  # fmt: skip

    panels = [
        Panel(
            "two users: accumulated service B - A",
            [Series(r.label, *_diff_curve(r, a, b)) for r in runs2],
            ylabel="service difference (prompt + 2 x output tokens)",
        ),
        Panel(
            f"two users: Jain's index per {width:g} s window",
            [Series(r.label, *_jain_series(r, width, warmup), style="o-") for r in runs2],
            ylabel="Jain's index (normalized)",
        ),
    ]

    runs8: list[Run] = []
    t8 = 180.0
    if not quick:
        cap8 = sim.capacity(*CHAT.mean())
        print(f"  eight users, capacity ~{cap8:.2f} req/s, offered {1.5 * cap8:.2f}", flush=True)
        runs8 = await run_all(sim, eight_users(t8, sim), _setups(quick), t8)
        panels8 = [
            Panel(
                f"eight users: Jain's index per {width:g} s window",
                [Series(r.label, *_jain_series(r, width, warmup), style="o-") for r in runs8],
                ylabel="Jain's index (normalized)",
            ),
            _share_panel(runs8[0], width),
            _share_panel(runs8[-1], width),
        ]
        plot_panels(out / f"{NAME}-8users.png", panels8, "Eight users at 1.5x capacity")
    plot_panels(out / f"{NAME}.png", panels, "Two users at 1.5x capacity")

    fifo, vtc = runs2[0], runs2[-1]
    diffs = [abs(r.ledger.served(b, r.duration) - r.ledger.served(a, r.duration)) for r in runs2]
    fifo_diff, vtc_diff = diffs[0], diffs[-1]
    ok = vtc_diff < 0.5 * fifo_diff and min(_jains(vtc, width, warmup)) > min(
        _jains(fifo, width, warmup)
    )
    rows8 = []
    for run in runs8:
        jains = _jains(run, width, warmup)
        light = [t for t in run.traces if t.spec.user.endswith("x1")]
        rows8.append([
            run.label, output_tokens(run.traces) / run.sim(run.duration),
            min(jains), sum(jains) / len(jains),
            p(ttfts(run, light), 50), p(ttfts(run, light), 99),
        ])  # fmt: skip
    if runs8:
        ok = ok and min(_jains(runs8[-1], width, warmup)) > min(_jains(runs8[0], width, warmup))

    report = Report(NAME, "Backlogged overload: FIFO vs round-robin vs vtc")
    r_f, r_v = rows[0], rows[-1]
    report.result = (
        f"two users at 1.5 and 3 req/s on a ~{cap2:.1f} req/s backend: after {t2:g} s the "
        f"accumulated service gap B-A is {r_f[4]:.0f} under FIFO and {r_v[4]:.0f} under vtc "
        f"({r_f[5]:.0%} vs {r_v[5]:.0%} of all service); Jain per {width:g} s window "
        f"min {r_f[6]:.2f} FIFO vs {r_v[6]:.2f} vtc"
        + (
            f"; eight users: Jain min {rows8[0][2]:.2f} FIFO vs {rows8[-1][2]:.2f} vtc"
            if rows8
            else ""
        )
        + "."
    )
    report.add(
        "Setup",
        f"""
Simulated vLLM, profile `{sim.profile}` (an 8B model on one A100, see
`fairq_sim/profiles.py`) with `--max-num-seqs {sim.max_num_seqs}`, which by the
profile's step-time model completes ~{cap2:.2f} requests/s of 256+256 tokens. Simulator speed
{sim.speed:g}x; all times below are simulated seconds. fairq: one tier, backend waiting
threshold 3, TPOT limit 150 ms, polling every 0.1 s; open mode (every user weight 1).
Requests still open at the end of the run are cancelled; service counts what was streamed
by then. Seed {SEED}.

- two users: Poisson, 1.5 and 3 req/s, 256 prompt / 256 output tokens, {t2:g} s.
- eight users (full run only): ShareGPT-like lengths ({CHAT.name}: prompt median
  {CHAT.prompt_median:g}, output median {CHAT.output_median:g} tokens, lognormal; see
  `workloads.py` for the sources), rates 8:4:2:2:1:1:1:1 summing to 1.5x capacity, users u2
  and u3 bursty (Gamma gaps, CV 2), {t8:g} s.

Service = prompt + 2 x output tokens (VTC's cost). Jain's index is taken over service
normalized by each user's max-min fair share of the window (1 = max-min fair; see
`service.py`); the first {warmup:g} s are skipped.
""",
    )
    report.add("Two users", markdown_table(header2, rows))
    if rows8:
        report.add(
            "Eight users",
            markdown_table(
                [
                    "scheduler",
                    "output tok/s",
                    "Jain min",
                    "Jain mean",
                    "light users' TTFT p50 (s)",
                    "light users' TTFT p99 (s)",
                ],
                rows8,
            ),
        )
    report.add(
        f"Jain's index per {width:g} s window",
        markdown_table(
            ["run", *[f"w{i}" for i in range(len(_jains(fifo, width, warmup)))]],
            _window_rows(runs2, width, warmup),
        )
        + (
            "\n\n"
            + markdown_table(
                ["run (8 users)", *[f"w{i}" for i in range(len(_jains(runs8[0], width, warmup)))]],
                _window_rows(runs8, width, warmup),
            )
            if runs8
            else ""
        ),
    )
    report.add(
        "Plots",
        f"![service difference and Jain's index]({NAME}.png)"
        + (f"\n\n![eight users]({NAME}-8users.png)" if runs8 else ""),
    )
    report.add(
        "What it shows",
        """
Under FIFO each user gets service in proportion to what it sends, so B (sending twice as
much) gets twice A's service and the gap grows linearly for as long as the overload lasts.
fairq's fair schedulers hand the backend one request at a time from the user with the least
service, so both users get the same rate and the gap stays flat; with equal request sizes
round-robin and vtc coincide. Throughput is the backend's either way: fairq keeps its queue
non-empty (waiting threshold 3), it only decides the order.
""",
    )
    report.add(
        "Reproduce",
        f"`uv run fairq bench {NAME} --backend sim{' --quick' if quick else ''}` "
        "(the simulator and fairq are started by the benchmark).",
    )
    report.write(out, quick)
    print(markdown_table(header2, rows), flush=True)
    return ok


def _jain_series(run: Run, width: float, warmup: float) -> tuple[list[float], list[float]]:
    wins = run.ledger.windows(run.wall(warmup), run.duration, run.wall(width))
    return [run.sim(s) + width / 2 for s, _ in wins], [j for _, j in wins]


def _share_panel(run: Run, width: float) -> Panel:
    series = []
    steps = int(run.sim(run.duration) // width)
    for user in run.ledger.users:
        xs, ys = [], []
        for k in range(steps):
            t0, t1 = run.wall(k * width), run.wall((k + 1) * width)
            xs.append((k + 0.5) * width)
            ys.append(run.ledger.served_between(t0, t1)[user] / width)
        series.append(Series(user, xs, ys, style="o-"))
    return Panel(f"eight users, {run.label}: service rate", series, ylabel="service / s")
