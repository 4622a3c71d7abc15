"""Scenario 6, prefix locality vs fairness (issue 4, experiment b): the quantum Q.

Eight users, each with its own long system prompt, all backlogged, on a simulated backend
whose KV cache holds only about three of those prompts. Pure fairness (Q=0) rotates through
the users, so each request finds its prompt evicted and pays the whole prefill; a bounded
quantum lets fairq serve a few requests of the same prefix together (DLPM, Cao et al. 2025)
while keeping every user's counter within Q of the others'; an unbounded Q serves whoever
is cached and starves the rest.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import httpx

from fairq_bench.report import markdown_table
from fairq_bench.scenarios.common import FairqSetup, SimSetup, Tier
from fairq_bench.scenarios.docs import Report
from fairq_bench.scenarios.plots import Panel, Series, plot_panels
from fairq_bench.scenarios.runs import Run, needs_sim, output_tokens, run_all
from fairq_bench.scenarios.workloads import arrivals, prompt_text
from fairq_bench.workload import RequestSpec
from fairq_server.backends.metrics import sample_sums

__all__ = ["prefix"]

NAME = "prefix"
SEED = 3
USERS = 8
SYSTEM_TOKENS = 2000
QUESTION_TOKENS = 50
OUTPUT_TOKENS = 64
BLOCK = 16
KV_BLOCKS = 415  # ~3 x (system prompt + one request's tail) of 16-token blocks
PREFIX_BLOCK_CHARS = 128
_QUERIES = "vllm:prefix_cache_queries_total"
_HITS = "vllm:prefix_cache_hits_total"


def workload(duration: float, rate: float) -> list[RequestSpec]:
    """Eight users, each ``rate`` req/s (Poisson), own 2000-token system prompt."""
    rng = random.Random(SEED)
    specs = []
    for u in range(USERS):
        user = f"tenant-{u}"
        system = prompt_text(SYSTEM_TOKENS, f"system prompt of {user}")
        for i, at in enumerate(arrivals(rng, rate, 0.0, duration)):
            text = prompt_text(SYSTEM_TOKENS + QUESTION_TOKENS, f"question {i}", prefix=system)
            specs.append(RequestSpec(user, text, OUTPUT_TOKENS, at=at))
    return specs


async def _cache_counters(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics")).text
    return sample_sums(text, (_QUERIES, _HITS))


def _setup(quantum: float) -> FairqSetup:
    # fairq's memory of what the backend caches should be about as large as the cache:
    # KV tokens x 4 characters per (simulator) token, in fairq's 128-character blocks.
    remembered = KV_BLOCKS * BLOCK * 4 // PREFIX_BLOCK_CHARS
    return FairqSetup(
        "vtc",
        (Tier("standard"),),
        scheduler={
            "prefix_quantum": f"{quantum:g}",
            "prefix_block_chars": str(PREFIX_BLOCK_CHARS),
            "prefix_cache_blocks": str(remembered),
        },
    )


def _stats(run: Run, width: float, warmup: float) -> tuple[float, float, float, float, float]:
    queries, hits = run.probe.get(_QUERIES, 0.0), run.probe.get(_HITS, 0.0)
    wins = [j for _, j in run.ledger.windows(run.wall(warmup), run.duration, run.wall(width))]
    done = sum(1 for t in run.traces if t.finished)
    return (
        hits / queries if queries else float("nan"),
        output_tokens(run.traces) / run.sim(run.duration),
        done / run.sim(run.duration),
        min(wins),
        sum(wins) / len(wins),
    )


async def prefix(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run scenario 6; True if a moderate Q raises hit rate and throughput, Jain >= 0.95."""
    if needs_sim(args, NAME):
        return True
    quick = args.quick
    sim = SimSetup(
        "llama-8b-gpu",
        16,
        speed=3.0 if quick else 2.0,
        extra=(
            "--kv-blocks",
            str(KV_BLOCKS),
            "--block-size",
            str(BLOCK),
            "--max-model-len",
            "4096",
        ),
    )
    duration, warmup, width = (30.0, 5.0, 25.0) if quick else (90.0, 10.0, 20.0)
    per_request = SYSTEM_TOKENS + QUESTION_TOKENS + 2 * OUTPUT_TOKENS  # vtc's charge, roughly
    quanta = [("Q=0", 0.0), ("Q=4 requests", 4.0 * per_request)]
    if not quick:
        quanta.insert(1, ("Q=1 request", 1.0 * per_request))
        quanta.append(("Q=unbounded", 1e12))
    # 1.5 req/s per user = 12 req/s in all: more than the backend completes even with hits.
    specs = workload(duration, 1.5)
    runs = await run_all(
        sim, specs, [(label, _setup(q)) for label, q in quanta], duration, probe=_cache_counters
    )
    stats = [_stats(r, width, warmup) for r in runs]
    rows = [
        [label, q, f"{s[0]:.1%}", s[1], s[2], f"{s[3]:.3f}", f"{s[4]:.3f}"]
        for (label, q), s in zip(quanta, stats, strict=True)
    ]
    header = [
        "quantum", "Q (weighted tokens)", "prefix-cache hit rate", "output tok/s",
        "requests/s", f"Jain min ({width:g} s windows)", "Jain mean",
    ]  # fmt: skip
    base, moderate = stats[0], stats[-1] if quick else stats[2]
    # The full run holds a moderate Q to Jain >= 0.95 over 20 s windows and 1.2x the
    # throughput; the quick run's single short window is noisier (on a loaded machine it
    # measured Jain 0.83-0.93 and 1.15-2.6x), so it only guards against a collapse (an
    # unbounded Q gives Jain 0.65) and a throughput that does not rise.
    fair_enough = moderate[3] >= (0.8 if quick else 0.95)
    faster = moderate[1] > (1.1 if quick else 1.2) * base[1]
    ok = moderate[0] > base[0] + 0.05 and faster and fair_enough

    plot_panels(
        out / f"{NAME}.png",
        [
            Panel(
                "hit rate vs throughput",
                [
                    Series(label, [s[1]], [s[0]], style="o")
                    for (label, _), s in zip(quanta, stats, strict=True)
                ],
                xlabel="output tokens / s",
                ylabel="prefix-cache hit rate",
            ),
            Panel(
                f"Jain's index per {width:g} s window",
                [Series(r.label, *_jain_series(r, width, warmup), style="o-") for r in runs],
                ylabel="Jain's index (normalized)",
                hlines=((0.95, "0.95"),),
            ),
        ],
        "Prefix locality vs fairness: 8 system prompts, KV holds 3",
    )
    report = Report(NAME, "Prefix locality vs fairness: the quantum Q")
    report.result = (
        f"Q=0: hit rate {base[0]:.0%}, {base[1]:.0f} output tok/s, Jain min {base[3]:.2f}; "
        f"{quanta[-1 if quick else 2][0]}: hit rate {moderate[0]:.0%}, {moderate[1]:.0f} tok/s "
        f"({moderate[1] / base[1]:.1f}x), Jain min {moderate[3]:.2f}"
        + (
            f"; unbounded Q: hit rate {stats[-1][0]:.0%}, Jain min {stats[-1][3]:.2f}"
            if not quick
            else ""
        )
        + "."
    )
    report.add(
        "Setup",
        f"""
Simulated vLLM, profile `{sim.profile}` with `--max-num-seqs {sim.max_num_seqs}
--kv-blocks {KV_BLOCKS} --block-size {BLOCK}`: {KV_BLOCKS * BLOCK} tokens of KV cache, room
for about three of the eight system prompts with their requests. Speed {sim.speed:g}x (times
in simulated seconds), {duration:g} s per run, seed {SEED}.

Eight users, each with its own {SYSTEM_TOKENS}-token system prompt followed by a
{QUESTION_TOKENS}-token question, {OUTPUT_TOKENS} output tokens, Poisson at 1.5 requests/s
each (12/s in all, above what the backend completes even with every prefix cached), so all
stay backlogged. fairq: vtc, one tier, waiting threshold 3, `prefix_block_chars =
{PREFIX_BLOCK_CHARS}`, `prefix_cache_blocks` sized like the backend's KV cache (so fairq's
memory of recently sent prefixes forgets about as fast as the backend evicts), and
`prefix_quantum` Q in vtc's units (prompt + 2 x output tokens; one request here is about
{per_request}). Hit rate is the simulator's `vllm:prefix_cache_hits_total /
vllm:prefix_cache_queries_total` (tokens) over the run.
""",
    )
    report.add("Results", markdown_table(header, rows))
    report.add("Plot", f"![hit rate, throughput and Jain's index]({NAME}.png)")
    report.add(
        "What it shows",
        """
With Q=0 fairq hands out requests in strict fairness order, which rotates through the eight
prefixes; a cache that holds three of them then misses nearly always, every request pays a
2000-token prefill, and the cache also limits how many distinct prefixes can run at once. A
quantum of a few requests lets the dispatcher pick, among the users within Q of the least
served, one whose prefix the backend has just seen: runs of the same prefix share their KV
blocks and skip the prefill, so hit rate and throughput go up, and every user still gets
its share over any window longer than a few requests. An unbounded Q is pure locality: the
users whose prompts are cached keep being picked and the others wait (Jain's index drops).
""",
    )
    report.add(
        "Reproduce", f"`uv run fairq bench prefix --backend sim{' --quick' if quick else ''}`"
    )
    report.write(out, quick)
    print(markdown_table(header, rows), flush=True)
    return ok


def _jain_series(run: Run, width: float, warmup: float) -> tuple[list[float], list[float]]:
    wins = run.ledger.windows(run.wall(warmup), run.duration, run.wall(width))
    return [run.sim(s) + width / 2 for s, _ in wins], [j for _, j in wins]
