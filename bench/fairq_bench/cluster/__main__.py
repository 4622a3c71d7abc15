"""``python -m fairq_bench.cluster``: the scale-out benchmarks and ``make demo-cluster``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from fairq_bench.cluster.table import plot_table, run_table, table_markdown, table_workload
from fairq_bench.redis_process import INSTALL_HINT, redis_server_path

__all__ = ["main"]


def _write(out: Path | None, name: str, text: str) -> None:
    print(text, flush=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text + "\n")
        print(f"written: {out / name}")


async def _run(args: argparse.Namespace) -> int:
    quick = args.quick
    if args.what in ("table", "demo"):
        counts = [1, 3] if args.what == "demo" else ([1, 2] if quick else [1, 2, 4])
        specs = table_workload(power=24 if quick else 60, power_tokens=120 if quick else 300,
                               light=2 if quick else 3)  # fmt: skip
        power = sum(1 for s in specs if s.user == "power")
        repeats = args.repeats or (3 if args.what == "table" and not quick else 1)
        print(
            f"One simulated vLLM (max_num_seqs 8, on a CPU of its own), tier threshold 3. "
            f"'power' sends {power} requests spread over the replicas; four light users send "
            "short ones to replica 0.\nEach replica count runs with every replica alone (no "
            "[cluster]), then sharing one gate and one fairness through Redis"
            + (f"; {repeats} rounds, interleaved." if repeats > 1 else "."),
            flush=True,
        )
        rows = await run_table(counts, specs, repeats=repeats)
        name = "cluster-demo" if args.what == "demo" else "cluster-table"
        _write(args.out, f"{name}.md", table_markdown(rows))
        if args.out is not None:
            plot_table(rows, args.out / f"{name}.png")
        return 0
    if args.what == "fairness":
        from fairq_bench.cluster.fairness import fairness_markdown, run_fairness

        plot = args.out / "cluster-fairness.png" if args.out else None
        result = await run_fairness(seconds=20 if quick else 120, window=10 if quick else 60,
                                    plot=plot)  # fmt: skip
        _write(args.out, "cluster-fairness.md", fairness_markdown(result))
        return 0
    if args.what == "cost":
        from fairq_bench.cluster.cost import cost_markdown, run_cost

        _write(args.out, "cluster-cost.md", cost_markdown(await run_cost(quick=quick)))
        return 0
    if args.what == "faults":
        from fairq_bench.cluster.faults import faults_markdown, run_faults

        _write(args.out, "cluster-faults.md", faults_markdown(await run_faults(quick=quick)))
        return 0
    raise AssertionError(args.what)


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark; its table is printed and, with ``--out``, written there."""
    parser = argparse.ArgumentParser(prog="python -m fairq_bench.cluster", description=__doc__)
    parser.add_argument("what", choices=("table", "fairness", "cost", "faults", "demo"))
    parser.add_argument("--quick", action="store_true", help="reduced size (CI)")
    parser.add_argument(
        "--repeats", type=int, default=0, help="table: runs per configuration (default 3, quick 1)"
    )
    parser.add_argument("--out", type=Path, help="directory for the markdown tables and plots")
    args = parser.parse_args(argv)
    if redis_server_path() is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    return asyncio.run(_run(args))


if __name__ == "__main__":
    raise SystemExit(main())
