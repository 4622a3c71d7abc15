"""Preemption by continuation: a light user under a flood of several power users.

Three power users each send a burst of long requests at once (more than the backend's running
slots); a light user sends short requests from t=0.5 s. The same workload goes straight to
the backend (FIFO), through fairq without preemption, and through fairq with preemption,
round after round, each round starting one run further along (interleaved and rotated, so the
machine's load, and the engine's drift within a round, fall on all of them alike).

Two costs of preemption are reported apart. *Regenerated* tokens are decoded twice: the
engine's own count of generated tokens (vLLM's ``vllm:generation_tokens_total``) less the
tokens the callers asked for and got (every request runs to ``max_tokens`` with
``ignore_eos``); this includes what the engine decoded after fairq's last read and before the
abort reached it, which fairq cannot see. A TGI backend counts no aborted request's tokens,
so there fairq's own ``fairq_preempt_regenerated_tokens_total`` stands in (a lower bound).
*Re-read* tokens are the victims' output that their continuations read again as prompt
(``fairq_preempt_resumed_tokens_total``): prefill, not decoding, and mostly a prefix-cache hit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import statistics
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from fairq_bench.local_engine import engine_pids, tree_run_seconds
from fairq_bench.processes import fairq_process, sim_process, toml_config
from fairq_bench.report import markdown_table, summarize
from fairq_bench.scenarios.docs import RESULT_PREFIX
from fairq_bench.targets import direct_sender, fairq_sender, free_port, http_client
from fairq_bench.workload import RequestResult, RequestSpec, SendFn, replay

__all__ = ["SLOTS_ONLY", "Cost", "flood_of_many", "preemption", "run_once"]

POWER_USERS = 3
LIGHT = "light-user"
MODES = ("direct", "fairq", "fairq + preemption")
#: With ``--decompose``: fairq capped at the engine's slots like the preemption run, but
#: without preemption, which splits what preemption costs from what the cap costs.
SLOTS_ONLY = "fairq, slots only"
#: With ``--decompose``: straight to the engine, the power users' requests at most its slots at
#: a time (the client sends the next as one ends) and the light user's as they come, so each
#: takes the next free slot: the order fairq's slot cap gives the work, with no fairq in the
#: path. What that order costs the engine, apart from what fairq costs.
DIRECT_SLOTS = "direct, slots only"


def flood_of_many(
    *, per_user: int = 8, power_tokens: int = 300, light: int = 5, light_tokens: int = 16
) -> list[RequestSpec]:
    """``POWER_USERS`` users send ``per_user`` long requests each at t=0; one light user later."""
    specs = [
        RequestSpec(f"power-{u}", f"Write a long report on queues, part {u}.{i}.", power_tokens)
        for u in range(POWER_USERS)
        for i in range(per_user)
    ]
    specs += [
        RequestSpec(LIGHT, f"Short question {i}?", light_tokens, at=0.5 + 0.7 * i)
        for i in range(light)
    ]
    return specs


@dataclass(frozen=True)
class Cost:
    """What one run's preemptions cost, as shares of the tokens the callers asked for.

    Attributes:
        regenerated: decoded twice (the engine's count; NaN where it has none, see
            ``fairq_side``).
        fairq_side: decoded twice as fairq counts it (output its continuations left out).
        reread: the victims' output read again as prompt by their continuations.
        step: the engine's mean time between two tokens of a request over the run (vLLM's
            inter-token latency; NaN elsewhere): how fast the machine let it run.
        engine_cpu: CPU seconds of the engine's processes over the replay, where the engine
            runs on this machine (NaN elsewhere): what the client made it work.

    """

    regenerated: float = 0.0
    fairq_side: float = 0.0
    reread: float = 0.0
    step: float = math.nan
    engine_cpu: float = math.nan


def fairq_config(
    url: str, model: str, kind: str, slots: int, metrics_port: int, mode: str,
    priority: bool = False,
) -> str:  # fmt: skip
    """fairq as before (mode ``fairq``), with preemption, or capped at the slots without it.

    ``priority``: the backend orders its queue by priority (vLLM ``--scheduling-policy
    priority``); fairq sends fair-share priorities to it in every run.
    """
    extra = f'metrics_listen = "127.0.0.1:{metrics_port}"\n'
    backend = "priority_scheduling = true\nfair_share_priority = true\n" if priority else ""
    if mode == "fairq":
        return toml_config(url, model, kind, extra) + backend
    # The slot count bounds the batch, so the TPOT hold is switched off (a large limit): held
    # while the engine has no queue of its own, it would leave running slots empty.
    extra += (
        '[[tiers]]\nname = "interactive"\npreempt_after_seconds = 0.0\n'
        "tpot_limit_seconds = 1000.0\n"
        '[[tiers]]\nname = "standard"\ntpot_limit_seconds = 1000.0\n'
        '[[tiers]]\nname = "batch"\nmax_backend_waiting = 0\ntpot_limit_seconds = 1000.0\n'
    )
    preempt = "" if mode == SLOTS_ONLY else "preempt = true\n"
    return toml_config(url, model, kind, extra) + backend + f"{preempt}max_in_flight = {slots}\n"


def _capped(send: SendFn, slots: int) -> SendFn:
    """Return ``send`` letting at most ``slots`` power requests run at once (first come, first
    in); the light user's go at once."""
    gate = asyncio.Semaphore(slots)

    async def capped(spec: RequestSpec) -> AsyncIterator[str]:
        async with contextlib.nullcontext() if spec.user == LIGHT else gate:
            async for token in send(spec):
                yield token

    return capped


def _metric(text: str, name: str) -> float:
    """Sum the samples of ``name`` in Prometheus text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


# The engine's counter of generated tokens; llama-server's counts a cancelled request's
# tokens too (flushed when its slot is reset). TGI has none for an aborted request.
_GENERATED = {"vllm": "vllm:generation_tokens_total", "llamacpp": "llamacpp:tokens_predicted_total"}


_STEP = "vllm:inter_token_latency_seconds"


async def _engine_counts(client: httpx.AsyncClient, url: str, kind: str) -> tuple[float, ...]:
    """The engine's tokens generated so far (NaN: TGI has no count), and vLLM's inter-token
    latency sum and count (NaN elsewhere)."""
    if kind not in _GENERATED:
        return math.nan, math.nan, math.nan
    text = (await client.get(f"{url}/metrics")).text
    step = (_metric(text, f"{_STEP}_sum"), _metric(text, f"{_STEP}_count"))
    return (_metric(text, _GENERATED[kind]), *(step if kind == "vllm" else (math.nan,) * 2))


async def run_once(
    url: str, model: str, kind: str, slots: int, specs: Sequence[RequestSpec], mode: str,
    priority: bool = False,
) -> tuple[list[RequestResult], Cost]:  # fmt: skip
    """Replay ``specs`` in ``mode``; return the results and what preemption cost."""
    pids = engine_pids(url)

    async def timed(send: SendFn) -> tuple[list[RequestResult], float]:
        """Replay ``specs`` through ``send``; also return the engine's CPU seconds meanwhile."""
        cpu = tree_run_seconds(pids)
        results = await replay(specs, send)
        return results, tree_run_seconds(pids) - cpu

    async with http_client() as client:
        before = await _engine_counts(client, url, kind)
        text = ""
        if mode == "direct":
            results, cpu = await timed(direct_sender(client, url, model, kind))
        elif mode == DIRECT_SLOTS:
            results, cpu = await timed(_capped(direct_sender(client, url, model, kind), slots))
        else:
            port = free_port()
            config = fairq_config(url, model, kind, slots, port, mode, priority)
            async with fairq_process(config) as target, grpc.aio.insecure_channel(target) as ch:
                results, cpu = await timed(fairq_sender(ch, model))
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        generated, step_sum, steps = (
            a - b for a, b in zip(await _engine_counts(client, url, kind), before, strict=True)
        )
    asked = sum(s.max_tokens for s in specs)
    delivered = sum(r.spec.max_tokens for r in results if not r.error)
    return results, Cost(
        regenerated=(generated - delivered) / asked,
        fairq_side=_metric(text, "fairq_preempt_regenerated_tokens_total") / asked,
        reread=_metric(text, "fairq_preempt_resumed_tokens_total") / asked,
        step=step_sum / steps if steps else math.nan,
        engine_cpu=cpu if pids else math.nan,
    )


async def preemption(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run the comparison; write ``preemption.md`` (``preemption-backend.md`` off the sim).

    On the simulator (``--backend sim``) in vLLM and TGI modes, 8 slots; against a running
    backend (``--backend URL --kind vllm --max-num-seqs N``) on that one, with a smaller flood.
    True when preemption halves the light user's worst TTFT against fairq without it: the
    worst is the request that arrived mid-wave, the wait preemption removes (the median sits at
    the floor either way when most light requests find a slot freeing, so it cannot tell).
    """
    real = args.backend != "sim"
    slots = args.max_num_seqs if real else 8
    rounds = getattr(args, "rounds", 0) or (1 if args.quick else (2 if real else 3))
    # A fast engine (llama.cpp on the tiny model) drains 12 requests before the light user's
    # last arrives: ``--per-user`` lengthens the flood.
    per_user = getattr(args, "per_user", 0) or (4 if real or args.quick else 8)
    # The quick simulator run (CI's direction check) has longer power requests (the model's
    # context is 512 tokens): with 300 and its few requests, the first wave ended 0.1-0.2 s
    # after the first light request came, and the light user's worst wait without preemption
    # (0.1-0.26 s) was too close to the worst with it (0.02-0.12 s) for a check. With 450:
    # 0.57 s against 0.022-0.025 s in four runs.
    power_tokens = 450 if args.quick and not real else 300
    specs = flood_of_many(per_user=per_user, power_tokens=power_tokens)
    modes = (*MODES, SLOTS_ONLY, DIRECT_SLOTS) if getattr(args, "decompose", False) else MODES
    sections, good = [], True
    results: list[str] = []
    for kind in (args.kind,) if real else ("vllm", "tgi"):
        runs: dict[str, list[tuple[list[RequestResult], Cost]]] = {m: [] for m in modes}
        async with contextlib.AsyncExitStack() as stack:
            target = url
            if not real:
                target = await stack.enter_async_context(
                    sim_process(
                        "--mode",
                        kind,
                        "--model",
                        "sim",
                        "--profile",
                        args.profile,
                        "--max-num-seqs",
                        str(slots),
                    )
                )
            for r in range(rounds):
                # Each round starts one place further along: with the same order every round,
                # any drift of the engine within a round would fall on the same runs.
                for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                    runs[mode].append(
                        await run_once(
                            target, args.model, kind, slots, specs, mode, args.priority_scheduling
                        )
                    )
        rows, light, summary = _rows(runs)
        good &= light["fairq + preemption"] < 0.5 * light["fairq"]
        where = args.describe or f"{args.backend}" if real else f"Simulator, {kind} mode"
        sections.append(f"### {where} ({slots} slots)\n\n{rows}\n\n{_per_round(runs)}\n")
        results.append(f"{where}: {summary}")
    power = len(specs) - 5
    page = (
        f"# Preemption by continuation — {'backend' if real else 'simulator'}\n\n"
        f"{POWER_USERS} power users send {power} requests of {power_tokens} tokens at t=0; a light "
        "user sends 5 requests of 16 tokens from t=0.5 s. Medians over "
        f"{rounds} interleaved round(s) ({', '.join(modes)}, each round starting one run "
        "further along).\n\n"
        + "\n".join(sections)
        + f"\n{RESULT_PREFIX} {'; '.join(results)}.\n"
        + f"\nReproduce: `{args.reproduce or 'fairq bench preemption'}`\n"
    )
    (out / ("preemption-backend.md" if real else "preemption.md")).write_text(page)
    return good


def _rows(
    runs: dict[str, list[tuple[list[RequestResult], Cost]]],
) -> tuple[str, dict[str, float], str]:
    """The table of medians per mode, the light user's worst TTFT per mode, and a summary."""
    med: dict[str, dict[str, float]] = {}
    for mode, rounds in runs.items():
        light = [summarize(mode, r, lambda u: u == LIGHT) for r, _ in rounds]
        power = [summarize(mode, r, lambda u: u != LIGHT) for r, _ in rounds]
        med[mode] = {
            "ttft_p50": statistics.median(s.ttft_p50 for s in light),
            "ttft_max": statistics.median(s.ttft_max for s in light),
            "makespan": statistics.median(s.makespan for s in power),
            "regen": statistics.median(c.regenerated for _, c in rounds),
            "fairq_side": statistics.median(c.fairq_side for _, c in rounds),
            "reread": statistics.median(c.reread for _, c in rounds),
            "errors": sum(s.errors for s in light + power),
        }
    d = med["direct"]
    table: list[Sequence[object]] = []
    for mode in runs:
        m = med[mode]
        table.append(
            (
                mode,
                f"{m['ttft_p50']:.3f} ({m['ttft_p50'] / d['ttft_p50']:.3f}x)",
                f"{m['ttft_max']:.3f} ({m['ttft_max'] / d['ttft_max']:.3f}x)",
                f"{m['makespan']:.2f} ({m['makespan'] / d['makespan']:.3f}x)",
                _share(m["regen"], m["fairq_side"]),
                f"{100 * m['reread']:.2f} %",
                int(m["errors"]),
            )
        )
    header = (
        "run", "light TTFT p50 s (vs direct)", "light TTFT max s (vs direct)",
        "power makespan s (vs direct)", "regenerated (decoded twice)",
        "re-read as prompt", "failed",
    )  # fmt: skip
    p = med["fairq + preemption"]
    summary = (
        f"with preemption the light user's TTFT p50 is {p['ttft_p50'] / d['ttft_p50']:.3f}x "
        f"direct, the power makespan {p['makespan'] / d['makespan']:.3f}x, "
        f"regenerated {_share(p['regen'], p['fairq_side'])}"
    )
    return markdown_table(header, table), {k: v["ttft_max"] for k, v in med.items()}, summary


def _per_round(runs: dict[str, list[tuple[list[RequestResult], Cost]]]) -> str:
    """Each round's power makespan against the direct run of the same round.

    The machine's speed drifts between runs by as much as the effects measured (the engine's
    time per token differs by up to 25 % between two runs a few seconds apart): the ratios
    show the spread the medians hide, and where the engine reports its inter-token latency,
    the makespan in engine steps (makespan / mean step) takes the drift out.
    """

    def makespan(results: list[RequestResult]) -> float:
        return summarize("", results, lambda u: u != LIGHT).makespan

    direct = [(makespan(r), c.step) for r, c in runs["direct"]]
    direct_cpu = [c.engine_cpu for _, c in runs["direct"]]
    lines, in_steps, in_cpu = [], [], []
    for mode in list(runs)[1:]:
        pairs = list(zip(runs[mode], direct, strict=True))
        ratios = [makespan(r) / d for (r, _), (d, _) in pairs]
        lines.append(f"{mode}: " + ", ".join(f"{x:.3f}x" for x in ratios))
        steps = [makespan(r) / c.step / (d / ds) for (r, c), (d, ds) in pairs]
        if not any(math.isnan(x) for x in steps):
            in_steps.append(
                f"{mode}: median {statistics.median(steps):.3f}x ("
                + ", ".join(f"{x:.3f}x" for x in steps)
                + ")"
            )
        cpu = [c.engine_cpu / d for (_, c), d in zip(runs[mode], direct_cpu, strict=True)]
        if not any(math.isnan(x) for x in cpu):
            in_cpu.append(f"{mode}: median {statistics.median(cpu):.3f}x")
    text = "Power makespan against the same round's direct run: " + "; ".join(lines) + "."
    if in_steps:
        text += (
            "\n\nThe same in engine steps (each run's makespan divided by the engine's mean "
            "inter-token latency over that run): " + "; ".join(in_steps) + "."
        )
    if in_cpu:
        text += (
            "\n\nThe engine's own CPU over the replay (its processes on this machine, read "
            "from the scheduler), against the same round's direct run: " + "; ".join(in_cpu) + "."
        )
    return text


def _share(engine: float, fairq_side: float) -> str:
    """The engine's count of tokens decoded twice; where it has none, fairq's (marked)."""
    if math.isnan(engine):
        return f"{100 * fairq_side:.2f} % (fairq's count)"
    return f"{100 * engine:.2f} %"
