"""``fairq bench closed-loop``: fair shares for callers with a few requests in flight.

For one engine (the simulator in vLLM or TGI mode, or a real engine at ``--backend URL``) it
runs every mix of :mod:`.mixes` straight to the engine and through fairq in each mode of
:mod:`.runner`, interleaved, then the same with fairq as three replicas on Redis (callers
spread over them), then the join: a user alone for 20 s, another joining (one process, one
replica and three with ``[cluster]``). Results go to ``closed-loop-<label>.json`` beside the
page; the page (:mod:`.page`) is rebuilt from every such file present, so runs on several
engines share one page.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from fairq_bench.closed_loop.efficiency import efficiency, rates
from fairq_bench.closed_loop.mixes import JOIN, MIXES, QUICK_MIXES, Caller, Mix
from fairq_bench.closed_loop.page import write_page
from fairq_bench.closed_loop.runner import (
    DIRECT,
    ENGINE_QUEUE,
    PREEMPT,
    SLOTS,
    Engine,
    Run,
    run_mix,
)
from fairq_bench.processes import confined, sim_process, split_cpus
from fairq_bench.redis_process import RedisProcess

__all__ = ["CLUSTER", "closed_loop"]

CLUSTER = "fairq, 3 replicas"
WARMUP = 3.0  # seconds of each run left out of its figures
WINDOW = 2.0  # seconds per point of the shares-over-time plots
#: The CI guard's bounds (a collapse, not the targets): share of the owed share, efficiency.
QUICK_SHARE, QUICK_EFFICIENCY, QUICK_JOIN = 0.6, 0.85, 0.25


@contextlib.asynccontextmanager
async def _engine(args: argparse.Namespace, url: str) -> AsyncIterator[Engine]:
    if args.backend != "sim":
        yield Engine(url, args.kind, args.model, args.max_num_seqs)
        return
    sim_cpus, other = split_cpus()
    argv = ["--mode", args.kind, "--profile", args.profile, "--model", "sim"]
    async with sim_process(*argv, "--max-num-seqs", str(args.max_num_seqs), cpus=sim_cpus) as sim:
        with confined(other):
            yield Engine(sim, args.kind, "sim", args.max_num_seqs)


def _summary(run: Run, rate: dict[int, float], slots: int) -> dict[str, Any]:
    fair = run.mix.fair_shares(slots)
    shares = run.shares(WARMUP)
    series: dict[str, list[float]] = {c.name: [] for c in run.mix.callers}
    t = WARMUP
    while t + WINDOW <= run.seconds + 1e-9:
        window = run.shares(t, t + WINDOW)
        for name in series:
            series[name].append(window[name])
        t += WINDOW
    return {
        "replicas": run.replicas,
        "shares": shares,
        "ratio": {k: shares[k] / fair[k] if fair[k] else 1.0 for k in shares},
        "tokens_per_second": run.throughput(WARMUP),
        "efficiency": efficiency(run, rate, WARMUP),
        "errors": run.errors,
        "requests": len(run.done),
        "series": series,
    }


async def _run(
    engine: Engine, mix: Mix, mode: str, seconds: float, rate: dict[int, float]
) -> dict[str, Any]:
    if mode == CLUSTER:
        with RedisProcess.running() as redis:
            run = await run_mix(engine, mix, SLOTS, seconds, replicas=3, redis=redis)
    else:
        run = await run_mix(engine, mix, mode, seconds)
    summary = _summary(run, rate, engine.slots)
    worst = min(summary["ratio"].values())
    print(
        f"  {mix.key:13s} {mode:22s} least share/owed {worst:.2f}  "
        f"{summary['tokens_per_second']:7.0f} tok/s  efficiency {summary['efficiency']:.3f}  "
        f"errors {run.errors}",
        flush=True,
    )
    return summary


async def _join(
    engine: Engine, replicas: int, redis: RedisProcess | None, alone: float, together: float
) -> dict[str, Any]:
    mix = Mix(JOIN.key, JOIN.title, (JOIN.callers[0], _at(JOIN.callers[1], alone)))
    run = await run_mix(engine, mix, SLOTS, alone + together, replicas=replicas, redis=redis)
    share = run.shares(alone, alone + together)["A"]
    windows = [run.shares(t, t + together / 4)["A"] for t in _steps(alone, together / 4, 4)]
    where = f"{replicas} replica(s){' on Redis' if redis else ''}"
    quarters = ", ".join(f"{w:.2f}" for w in windows)
    print(f"  join, {where}: A {share:.3f} after B joined (quarters {quarters})", flush=True)
    return {"replicas": replicas, "cluster": redis is not None, "share": share, "quarters": windows}


def _at(c: Caller, start: float) -> Caller:
    return Caller(c.name, c.in_flight, c.tokens, c.weight, c.team, start)


def _steps(start: float, step: float, n: int) -> list[float]:
    return [start + i * step for i in range(n)]


async def _later(engine: Engine, redis: RedisProcess, seconds: float, idle: float) -> float:
    """After ``idle`` seconds, fresh replicas on the same Redis: A and B from the start."""
    waited = 0.0
    while waited < idle:
        step = min(60.0, idle - waited)
        await asyncio.sleep(step)  # the idle time being measured: nothing runs meanwhile
        waited += step
        print(f"  ... {waited:.0f} s of {idle:.0f} s idle", flush=True)
    mix = Mix(JOIN.key, JOIN.title, (JOIN.callers[0], _at(JOIN.callers[1], 0.0)))
    run = await run_mix(engine, mix, SLOTS, seconds, replicas=3, redis=redis)
    share = run.shares(WARMUP)["A"]
    print(f"  {idle:.0f} s later, fresh replicas on the same Redis: A {share:.3f}", flush=True)
    return share


def _modes(args: argparse.Namespace, engine: Engine) -> list[str]:
    """Direct and fairq; in a full run preemption too, and on the simulator's vLLM mode the
    configuration without the slots (what a new user gets; the engine's queue orders)."""
    modes = [DIRECT, SLOTS]
    if not args.quick:
        modes.append(PREEMPT)
        if args.backend == "sim" and args.kind == "vllm":
            modes.insert(1, ENGINE_QUEUE)
    return modes


async def closed_loop(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Scenario ``closed-loop``: write ``closed-loop-<label>.json`` and the page."""
    seconds = 8.0 if args.quick else 15.0
    mixes: Sequence[Mix] = QUICK_MIXES if args.quick else MIXES
    label = args.label if args.label != "sim" else f"sim-{args.kind}"
    started = time.monotonic()
    async with _engine(args, url) as engine:
        print(f"closed loop on {label}: {len(mixes)} mixes", flush=True)
        lengths = {c.tokens for m in (*mixes, JOIN) for c in m.callers}
        rate = await rates(engine, lengths, 6.0 if args.quick else 10.0, WARMUP)
        print(f"  engine rates (tokens/s, slots busy): {rate}", flush=True)
        modes = _modes(args, engine)
        cluster = (args.backend == "sim" and args.kind == "vllm") or args.cluster
        results = []
        for i, mix in enumerate(mixes):
            print(f"[{i + 1}/{len(mixes)}] {mix.title}", flush=True)
            runs = {mode: await _run(engine, mix, mode, seconds, rate) for mode in modes}
            if cluster and (not args.quick or mix is mixes[0]):
                runs[CLUSTER] = await _run(engine, mix, CLUSTER, seconds, rate)
            results.append(
                {
                    "key": mix.key,
                    "title": mix.title,
                    "callers": {c.name: c.in_flight for c in mix.callers},
                    "fair": mix.fair_shares(engine.slots),
                    "runs": runs,
                }
            )
        alone, together = (6.0, 4.0) if args.quick else (20.0, 10.0)
        join = [await _join(engine, 1, None, alone, together)]
        if cluster:
            with RedisProcess.running() as redis:
                join.append(await _join(engine, 1, redis, alone, together))
            with RedisProcess.running() as redis:
                join.append(await _join(engine, 3, redis, alone, together))
                later = await _later(engine, redis, 10.0, args.later) if args.later else None
        else:
            later = None
    record = {
        "label": label,
        "describe": args.describe or f"simulator ({args.kind} mode, {args.profile})",
        "slots": engine.slots,
        "seconds": seconds,
        "warmup": WARMUP,
        "quick": args.quick,
        "rates": {str(k): v for k, v in rate.items()},
        "mixes": results,
        "join": join,
        "later": None if later is None else {"seconds": args.later, "share": later},
        "minutes": (time.monotonic() - started) / 60,
        "reproduce": args.reproduce or f"uv run fairq bench closed-loop --kind {args.kind}",
    }
    (out / f"closed-loop-{label}.json").write_text(json.dumps(record, indent=1) + "\n")
    write_page(out)
    return _judge(record)


def _judge(record: dict[str, Any]) -> bool:
    """The quick run's guard against a collapse; the full run's targets."""
    share, eff, join = (
        (QUICK_SHARE, QUICK_EFFICIENCY, QUICK_JOIN) if record["quick"] else (0.9, 0.97, 0.4)
    )
    ok = True
    for mix in record["mixes"]:
        direct = mix["runs"][DIRECT]["efficiency"]
        for mode, run in mix["runs"].items():
            if mode in (DIRECT, ENGINE_QUEUE):
                continue
            if min(run["ratio"].values()) < share or run["efficiency"] < eff * direct:
                print(f"  below target: {mix['key']} {mode}", flush=True)
                ok = False
    for j in record["join"]:
        if j["share"] < join:
            print(f"  below target: join with {j['replicas']} replica(s)", flush=True)
            ok = False
    return ok
