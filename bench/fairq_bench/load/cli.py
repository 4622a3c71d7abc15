"""Command line of ``python -m fairq_bench.load``: the phases and their checks, and the
hidden modes that run the prober and the control server as helper processes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections import Counter
from collections.abc import Coroutine
from dataclasses import replace

from fairq_bench.load.capacity import capacity
from fairq_bench.load.prober import control_server, probe_forever
from fairq_bench.load.sizes import FULL, QUICK, LoadSize
from fairq_bench.load.soak import soak
from fairq_bench.load.tables import capacity_table, soak_table

__all__ = ["main", "run"]


async def run(size: LoadSize, *, do_capacity: bool = True, do_soak: bool = True) -> bool:
    """Run the phases, print their tables; return whether every check held."""
    ok = True
    if do_capacity:
        cap = await capacity(size)
        print(capacity_table(cap), flush=True)
        ok &= not cap.tally.violations and cap.tally.codes == Counter(
            {"OK": size.streams + size.queued}
        )
        ok &= cap.peak_in_flight == size.streams and cap.quiet_after
    if do_soak:
        result = await soak(size)
        print(soak_table(result), flush=True)
        ok &= result.quiet_every_round
        ok &= all(x.violations == 0 and x.counted_ok for x in result.rounds)
    return ok


def main(argv: list[str] | None = None) -> int:
    """``python -m fairq_bench.load [--quick]``: exit 1 if a check failed."""
    from fairq_bench import load  # the package: its docstring's first line describes it

    parser = argparse.ArgumentParser(
        prog="python -m fairq_bench.load", description=(load.__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a minute or two)")
    parser.add_argument("--streams", type=int)
    parser.add_argument("--queued", type=int)
    parser.add_argument("--users", type=int)
    parser.add_argument("--soak-seconds", type=float)
    parser.add_argument("--speed", type=float, help="simulator clock factor")
    parser.add_argument("--no-capacity", action="store_true")
    parser.add_argument("--no-soak", action="store_true")
    parser.add_argument("--probe", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--probe-control", help=argparse.SUPPRESS)
    parser.add_argument("--probe-interval", type=float, default=0.02, help=argparse.SUPPRESS)
    parser.add_argument("--control-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe or args.control_server:
        # Helper processes of a run: they serve until the run sends SIGTERM.
        with contextlib.suppress(KeyboardInterrupt):
            if args.control_server:
                asyncio.run(_until_sigterm(control_server()))
            else:
                probe = probe_forever(args.probe, args.probe_control, args.probe_interval)
                asyncio.run(_until_sigterm(probe))
        return 0
    size = QUICK if args.quick else FULL
    overrides = {
        k: getattr(args, k)
        for k in ("streams", "queued", "users", "soak_seconds", "speed")
        if getattr(args, k) is not None
    }
    size = replace(size, **overrides)

    async def interruptible() -> bool:
        # SIGTERM (e.g. from `timeout`) cancels the run, so every child process is stopped.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run(size, do_capacity=not args.no_capacity, do_soak=not args.no_soak)

    try:
        ok = asyncio.run(interruptible())
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("load: interrupted", file=sys.stderr)
        return 1
    print("load: all checks held" if ok else "load: A CHECK FAILED", flush=True)
    return 0 if ok else 1


async def _until_sigterm(work: Coroutine[None, None, None]) -> None:
    """Run ``work`` until SIGTERM cancels it (a cancellation reaches the tasks it awaits,
    where an interrupt raised from the signal handler would leave them unretrieved)."""
    task = asyncio.ensure_future(work)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
