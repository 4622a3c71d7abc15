"""``fairq sim``: serve a simulated vLLM or TGI backend until SIGINT/SIGTERM.

SIGUSR1 holds the engine (running requests keep their slots, no token is made) and SIGUSR2
releases it: a load run in another process holds it while it fills fairq's queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import signal
import sys
from collections.abc import Iterator

import uvicorn

from fairq_sim.app import create_app, sim_state
from fairq_sim.config import SimConfig
from fairq_sim.profiles import PROFILES
from fairq_sim.runner import EngineRunner
from fairq_sim.server import bind_socket

__all__ = ["build_parser", "config_from_args", "listen_error", "main"]


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``fairq sim``."""
    p = argparse.ArgumentParser(
        prog="fairq sim",
        description="Simulated continuous-batching LLM backend (vLLM, SGLang or TGI HTTP API).",
        epilog="SIGUSR1 holds the engine (no step, no token), SIGUSR2 releases it.",
    )
    p.add_argument("--mode", choices=("vllm", "tgi", "sglang"), default="vllm")
    p.add_argument("--model", default="sim", help="served model name (default: sim)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--profile", choices=sorted(PROFILES), default="tiny-cpu")
    p.add_argument("--max-num-seqs", type=int, help="sequences running at once")
    p.add_argument("--max-model-len", type=int, help="context length in tokens")
    p.add_argument("--kv-blocks", type=int, help="KV cache size in blocks")
    p.add_argument("--block-size", type=int, help="tokens per KV block")
    p.add_argument("--max-num-batched-tokens", type=int, help="token budget per step")
    p.add_argument("--speed", type=float, default=1.0, help="clock factor (2 = twice as fast)")
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    p.add_argument(
        "--schedule-low-priority-values-first",
        action="store_true",
        help="sglang: lower priority values first (default: higher first, as SGLang)",
    )
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument(
        "--max-concurrent-requests", type=int, default=128, help="TGI: overloaded beyond this"
    )
    p.add_argument("--eos-mean-tokens", type=float, help="mean output length before an EOS")
    p.add_argument("--seed", type=int, default=0)
    faults = p.add_argument_group("fault injection")
    faults.add_argument("--startup-delay", type=float, default=0.0, help="seconds of 503s")
    faults.add_argument("--error-rate", type=float, default=0.0, help="fraction answered 500")
    faults.add_argument("--drop-after-tokens", type=int, help="cut streams after N tokens")
    faults.add_argument("--metrics-fail", action="store_true", help="/metrics answers 500")
    faults.add_argument("--metrics-delay", type=float, default=0.0, help="seconds")
    return p


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Turn parsed arguments into a :class:`SimConfig`."""
    return SimConfig(
        mode=args.mode,
        model=args.model,
        profile=args.profile,
        max_num_seqs=args.max_num_seqs,
        speed=args.speed,
        priority_mode=args.scheduling_policy == "priority",
        low_priority_first=args.schedule_low_priority_values_first,
        api_key=args.api_key,
        max_model_len=args.max_model_len,
        kv_blocks=args.kv_blocks,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_concurrent_requests=args.max_concurrent_requests,
        eos_mean_tokens=args.eos_mean_tokens,
        seed=args.seed,
        startup_delay=args.startup_delay,
        error_rate=args.error_rate,
        drop_after_tokens=args.drop_after_tokens,
        metrics_fail=args.metrics_fail,
        metrics_delay=args.metrics_delay,
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq sim``; print the URL, serve until SIGINT or SIGTERM.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status.

    """
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args)
    try:
        app = create_app(config)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"fairq sim: {listen_error(args.host, args.port, exc)}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    profile = sim_state(app).profile
    print(f"http://{host}:{port}", flush=True)
    print(
        f"fairq sim: {config.mode} model={config.model} profile={profile.name} "
        f"max_num_seqs={profile.max_num_seqs} speed={config.speed} "
        f"policy={args.scheduling_policy}",
        file=sys.stderr,
        flush=True,
    )
    server = _QuietExitServer(
        uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    )
    server.runner = sim_state(app).runner
    # SIGINT/SIGTERM: stop accepting, end open streams within 2 s, run the app's shutdown.
    asyncio.run(server.serve(sockets=[sock]))
    return 0


def listen_error(host: str, port: int, exc: OSError) -> str:
    """One line for a failed bind: the address, the options that set it, and why."""
    reasons = {
        errno.EADDRINUSE: "address already in use (another process listens there; "
        "--port 0 picks a free port)",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
        errno.EADDRNOTAVAIL: "no such address on this machine",
    }
    reason = reasons.get(exc.errno or 0) or exc.strerror or str(exc)
    shown = f"[{host}]" if ":" in host else host
    return f"cannot listen on {shown}:{port} (set by --host/--port): {reason}"


class _QuietExitServer(uvicorn.Server):
    """uvicorn's server, minus re-raising the signal after a graceful shutdown.

    uvicorn re-raises SIGINT/SIGTERM once it has shut down, so the process would die of the
    signal; ``fairq sim`` should instead return from :func:`main` with status 0.
    """

    runner: EngineRunner | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Route SIGINT/SIGTERM to a graceful exit, SIGUSR1/SIGUSR2 to the engine's hold.

        A second SIGINT forces the exit. SIGUSR1 holds the engine and SIGUSR2 releases it
        (:meth:`EngineRunner.hold`): the one control a load run has over a simulator in
        another process.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        if self.runner is not None:
            loop.add_signal_handler(signal.SIGUSR1, self.runner.hold)
            loop.add_signal_handler(signal.SIGUSR2, self.runner.release)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
                loop.remove_signal_handler(sig)
