"""``fairq bench``: run benchmark scenarios and write their tables and plots.

Results go to a scratch folder (``--out``, default ``bench-results/`` in the working
directory); ``--write-docs`` writes them over the committed pages in ``docs/benchmarks/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from fairq_bench.closed_loop.scenario import closed_loop
from fairq_bench.envoy_bench import envoy_scenario
from fairq_bench.flood import compare_flood, flood_workload
from fairq_bench.hot_path.scenario import hot_path
from fairq_bench.processes import sim_process
from fairq_bench.report import plot_ttft
from fairq_bench.scenarios import SCENARIOS as MORE_SCENARIOS
from fairq_bench.scenarios import TITLES
from fairq_bench.scenarios.docs import write_readme

__all__ = ["main"]

DOCS_DIR = Path("docs/benchmarks")
SCRATCH_DIR = Path("bench-results")

Scenario = Callable[[argparse.Namespace, str, Path], Awaitable[bool]]


@contextlib.asynccontextmanager
async def _backend(args: argparse.Namespace) -> AsyncIterator[str]:
    if args.backend == "sim":
        async with sim_process(
            "--mode", args.kind, "--model", args.model, "--profile", args.profile,
            "--max-num-seqs", str(args.max_num_seqs),
        ) as url:  # fmt: skip
            yield url
    else:
        yield args.backend.rstrip("/")


async def _flood(args: argparse.Namespace, url: str, out: Path) -> bool:
    # Quick: 40, not 20; with 20 the flood has nearly drained when the later light requests
    # arrive, and the light-user ratio sat at 0.57-0.67 (check: < 0.5) on the 2-core box.
    power = 40 if args.quick else 60
    specs = flood_workload(
        power_requests=power, power_tokens=300, light_requests=3 if args.quick else 6
    )
    result = await compare_flood(url, args.model, args.kind, specs)
    ratios = result.ratios()
    name = f"flood-{args.label}"
    plot_ttft(out / f"{name}.png", [("direct (FIFO)", result.direct), ("fairq", result.fairq)],
              f"Power-user flood ({args.label}): TTFT per request")  # fmt: skip
    (out / f"{name}.md").write_text(
        f"# Power-user flood — {args.label}\n\n"
        f"One user sends {power} requests of 300 tokens at once; another sends short requests "
        "from t=0.5 s. Same workload straight to the backend (FIFO) and through fairq, in one "
        f"run. Backend: {args.describe or args.backend} ({args.kind}).\n\n{result.table()}\n\n"
        f"![TTFT per request]({name}.png)\n\n"
        f"Reproduce: `{args.reproduce or f'fairq bench flood --backend {args.backend}'}`\n"
    )
    print(result.table())
    # Direction checks: fairq must help the light user and not cost the power user much.
    return ratios["light_ttft_p50"] < 0.5 and ratios["power_makespan"] < 1.25


_KINDS = ("vllm", "tgi", "openai")
_PRESETS = ("sglang", "llamacpp")
SCENARIOS: dict[str, Scenario] = {
    "flood": _flood,
    **MORE_SCENARIOS,
    "hot-path": hot_path,
    "closed-loop": closed_loop,
    "envoy": envoy_scenario,
}
HOT_PATH_TITLE = "12. The hot path (tokens per fairq core-second, added TTFT, Redis replicas)"
CLOSED_LOOP_TITLE = "18. Closed-loop callers (fair shares at 1-12 in flight, joins, replicas)"
ENVOY_TITLE = "19. fairq behind Envoy (the ext_proc picker: tokens per core-second, added TTFT)"


def _write_readme(args: argparse.Namespace) -> None:
    """Summarise every scenario page present in the output folder."""
    floods = dict.fromkeys([f"flood-{args.label}.md", "flood-sim.md", "flood-vllm.md"])
    pages = [(f"1. Power-user flood ({page[6:-3]})", page) for page in floods]
    pages += [(TITLES[name], f"{name}.md") for name in MORE_SCENARIOS]
    pages.append((HOT_PATH_TITLE, "hot-path.md"))
    pages.append((CLOSED_LOOP_TITLE, "closed-loop.md"))
    pages.append((ENVOY_TITLE, "envoy.md"))
    write_readme(args.out, pages)


def main(argv: list[str] | None = None) -> int:
    """Run the named scenarios (or all); exit 1 if a result points the wrong way."""
    parser = argparse.ArgumentParser(
        prog="fairq bench",
        description="Run benchmark scenarios and write their tables and plots. Results go "
        "to --out (default: bench-results/ in the working directory); --write-docs writes "
        "them over the committed pages in docs/benchmarks/.",
    )
    parser.add_argument("scenarios", nargs="*", default=["all"], help=", ".join(SCENARIOS))
    parser.add_argument("--backend", default="sim", help="'sim' or a backend base URL")
    parser.add_argument(
        "--kind",
        default="vllm",
        help="the backend's kind, as in [[backends]]: vllm, tgi or openai (default: vllm)",
    )
    parser.add_argument(
        "--metrics-preset",
        choices=_PRESETS,
        help="with --kind openai: the engine's metric names, as in [[backends]]",
    )
    parser.add_argument("--model", default="sim")
    parser.add_argument("--profile", default="tiny-cpu", help="simulator profile")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="simulator batch size")
    parser.add_argument("--label", default="", help="suffix of output files (default: backend)")
    parser.add_argument(
        "--out", type=Path, help="output folder (default: bench-results/, never the docs)"
    )
    parser.add_argument(
        "--write-docs", action="store_true",
        help=f"write the results into {DOCS_DIR}/ (the committed pages)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="reduced sizes (CI)")
    parser.add_argument(
        "--priority-scheduling", action="store_true",
        help="preemption: the backend orders its queue by priority (vLLM --scheduling-policy "
        "priority); fairq sends it fair-share priorities",
    )  # fmt: skip
    parser.add_argument(
        "--per-user", type=int, default=0,
        help="preemption: power requests per power user (default 4 on a backend, 8 on the sim)",
    )  # fmt: skip
    parser.add_argument(
        "--decompose", action="store_true",
        help="preemption: also run fairq capped at the slots without preemption (what the cap "
        "costs apart from what preemption costs)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=0,
        help="preemption: interleaved rounds (default 2 on a backend, 3 on the sim, 1 quick)",
    )  # fmt: skip
    parser.add_argument(
        "--later", type=float, default=0.0,
        help="closed-loop: also run the join again this many seconds later, on fresh replicas "
        "sharing the same Redis (e.g. 960)",
    )  # fmt: skip
    parser.add_argument(
        "--cluster", action="store_true",
        help="closed-loop: also run three replicas on Redis (always on the simulator's vllm mode)",
    )  # fmt: skip
    parser.add_argument("--describe", default="", help="backend description for the report")
    parser.add_argument("--reproduce", default="", help="command shown in the report")
    parser.add_argument(
        "--flame", action="store_true", help="hot-path: also write py-spy flame graphs"
    )
    parser.add_argument(
        "--as-before", action="store_true", help="hot-path: record this run as 'before'"
    )
    parser.add_argument(
        "--cpus",
        default="",
        help="pin the load generator and the fairq/sim children to these CPUs, e.g. '1' "
        "(keep them off a local backend's cores, as on a real deployment)",
    )
    args = parser.parse_args(argv)
    # Inside, a kind names the engine: the openai kind with a preset is the preset's name
    # (what the simulator's --mode and the scenarios' configurations take). --kind sglang
    # and --kind llamacpp are the older spellings of --kind openai --metrics-preset NAME.
    if args.kind not in (*_KINDS, *_PRESETS):
        parser.error(f"--kind {args.kind!r}: expected one of {', '.join(_KINDS)}")
    if args.metrics_preset is not None:
        if args.kind != "openai":
            parser.error("--metrics-preset goes with --kind openai")
        args.kind = args.metrics_preset
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    args.label = args.label or ("sim" if args.backend == "sim" else "backend")
    names = list(SCENARIOS) if args.scenarios in (["all"], []) else args.scenarios
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; valid: {', '.join(SCENARIOS)}")
    if args.write_docs and args.out is not None:
        parser.error("--write-docs and --out exclude each other")
    if args.write_docs and args.quick:
        parser.error("--write-docs publishes full-size results; drop --quick")
    args.out = DOCS_DIR if args.write_docs else (args.out or SCRATCH_DIR)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"results go to {args.out}/", flush=True)

    async def run() -> bool:
        ok = True
        async with _backend(args) as url:
            for name in names:
                started = time.monotonic()
                print(f"== {name} ==", flush=True)
                passed = await SCENARIOS[name](args, url, args.out)
                print(f"== {name}: {'ok' if passed else 'WRONG DIRECTION'} "
                      f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
                ok &= passed
        _write_readme(args)
        return ok

    return 0 if asyncio.run(run()) else 1


if __name__ == "__main__":
    sys.exit(main())
