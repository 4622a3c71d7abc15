"""The ``fairq`` command: ``serve`` and the operator tools (``keys``, ``teams``, ``usage``, ...).

Each subcommand imports what it needs when it runs: the service (SQLAlchemy, gRPC, both
doors, the scheduler) takes seconds to import, and ``fairq --help``, ``fairq keys create
--file`` or a container's ``fairq health`` need none of it
(``tests/unit/test_cli_imports.py`` holds them to that).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING

from fairq_server import logs
from fairq_server.errors import ConfigError, SchedulerError

if TYPE_CHECKING:
    import asyncio

    from fairq_server.app import FairqServer

__all__ = ["LOOPS", "event_loop_factory", "main"]


LOOPS = ("auto", "uvloop", "asyncio")


def event_loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Return the loop factory ``fairq serve --loop CHOICE`` runs on; None is asyncio's own.

    Every token through either door is a socket read and a socket write on this loop; with
    uvloop the loop's own share of that (callbacks, transports, the selector) is compiled
    code, so ``auto`` takes uvloop where it is installed (Linux, macOS). ``asyncio`` keeps
    the standard loop (to compare, or to rule the loop out when chasing a fault).
    docs/design/hot-path.md has the measured difference.

    Raises:
        ConfigError: ``uvloop`` was asked for and is not installed, or the choice is unknown.

    """
    if choice not in LOOPS:
        raise ConfigError(f"--loop {choice!r}: expected one of {', '.join(LOOPS)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop  # optional: not built for Windows
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--loop uvloop: uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from fairq_server.app import FairqServer
    from fairq_server.config.loader import load_config
    from fairq_server.scheduling.policies import check_policies

    try:
        config = load_config(args.config)
        check_policies(config.scheduler)  # the plugins' own options: a typo stops serve here
        if args.access_log:
            config = dataclasses.replace(config, access_log=True)
        loop_factory = event_loop_factory(args.loop)
    except (OSError, ConfigError) as exc:
        print(f"fairq: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        server = FairqServer(config)
        try:
            await server.start()
        except BaseException:
            # A port in use, a missing TLS file: release what did start before saying so.
            await server.stop(grace=0)
            raise
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        reloads: set[asyncio.Task[None]] = set()
        loop.add_signal_handler(
            signal.SIGHUP, lambda: _spawn(reloads, _reload(server, args.config, args.access_log))
        )
        # Ready only once signals are handled: a SIGHUP sent on seeing this line must
        # reload, not kill the process (SIGHUP's default action).
        print(f"fairq serving on {config.listen} (port {server.port})", flush=True)
        await stop.wait()
        log = logging.getLogger("fairq")
        running = sum(b.in_flight for b in server.core.backends())
        queued = max(server.core.live_requests() - running, 0)
        # Say what will happen, not the worst case as if it were certain: an idle fairq
        # stops at once, a busy one when its last stream ends or the grace runs out.
        log.info(
            "stopping: %d queued requests answered UNAVAILABLE; draining: up to %.0f s for "
            "%d requests in flight",
            queued, args.grace, running,
        )  # fmt: skip
        started = time.monotonic()
        await server.stop(grace=args.grace)
        log.info("stopped after %.1f s", time.monotonic() - started)

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(run())
    except (ConfigError, SchedulerError, OSError, ValueError) as exc:
        # A configuration that parses but cannot work (bad backend URL, unknown policy,
        # missing TLS files, port in use): one line, no traceback.
        print(f"fairq: {exc}", file=sys.stderr)
        return 2
    return 0


async def _reload(server: FairqServer, path: str, access_log: bool) -> None:
    from fairq_server.config.loader import load_config
    from fairq_server.scheduling.policies import check_policies

    log = logging.getLogger("fairq")
    try:
        config = load_config(path)
        check_policies(config.scheduler)
        if access_log:  # the command line's --access-log outlives reloads
            config = dataclasses.replace(config, access_log=True)
        await server.reload(config)
    except (OSError, ConfigError) as exc:
        log.error("reload of %s refused, configuration unchanged: %s", path, exc)
    except Exception:
        # Validation should have caught it; never let a reload die unseen in its task.
        log.exception("reload of %s failed", path)


def _spawn(tasks: set[asyncio.Task[None]], coro: Coroutine[None, None, None]) -> None:
    import asyncio

    task = asyncio.create_task(coro)
    tasks.add(task)  # keep a reference until it is done
    task.add_done_callback(tasks.discard)


def main(argv: list[str] | None = None) -> int:
    """Run the ``fairq`` command line."""
    parser = argparse.ArgumentParser(prog="fairq", description="Fair scheduling for LLM backends.")
    parser.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default: INFO)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run fairq (its gRPC and HTTP doors)")
    serve.add_argument("--config", required=True, help="TOML configuration file")
    serve.add_argument("--grace", type=float, default=30.0, help="seconds to drain on SIGTERM")
    serve.add_argument(
        "--access-log", action="store_true", help="one JSON line per request on stdout"
    )
    serve.add_argument(
        "--loop",
        choices=LOOPS,
        default="auto",
        help="event loop: uvloop where installed (auto), or asyncio's own",
    )
    sub.add_parser("health", help="exit 0 if a fairq reports serving", add_help=False)
    sub.add_parser(
        "keys",
        help="API keys: create, list, revoke, rotate (create --file: for the configuration file)",
        add_help=False,
    )
    sub.add_parser("teams", help="team weights kept in the store: set/delete/list", add_help=False)
    sub.add_parser("limits", help="quotas and budgets kept in the store", add_help=False)
    sub.add_parser("audit", help="the audit log of admins' changes", add_help=False)
    sub.add_parser("usage", help="usage by team, user or model (the ledger)", add_help=False)
    sub.add_parser("db", help="the store's schema: fairq db upgrade --config FILE", add_help=False)
    sub.add_parser("top", help="live view of queues, users and backends", add_help=False)
    sub.add_parser(
        "envoy", help="fairq behind Envoy: envoy bootstrap --config FILE", add_help=False
    )
    sub.add_parser("sim", help="run the simulated backend (see fairq sim --help)", add_help=False)
    sub.add_parser("demo", help="the power-user story on a simulated backend", add_help=False)
    sub.add_parser("bench", help="run benchmark scenarios", add_help=False)
    args, rest = parser.parse_known_args(argv)
    logs.configure(args.log_level)
    # One line per HTTP request to a backend is noise at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _serve(args)
    try:
        return _run_tool(args.command, rest)
    except BrokenPipeError:
        # The reader left early (`fairq top --once | head -3`): not fairq's failure, and no
        # traceback. Python's own advice: point stdout at /dev/null so the exit's flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run_tool(name: str, rest: list[str]) -> int:
    """Run operator tool or plugin command ``name`` with its arguments."""
    if name in _TOOLS:
        module = importlib.import_module(_TOOLS[name])
        return int(module.main(rest))
    command = _plugin_command(name)
    if command is None:
        package = _PLUGIN_PACKAGES[name]
        print(
            f"fairq {name} comes with the {package} package, which is not installed: "
            f"from a checkout, pip install {_PLUGIN_FOLDERS[package]} (or `make sync`)",
            file=sys.stderr,
        )
        return 2
    return int(command(rest))


def _plugin_command(name: str) -> Callable[[list[str]], int] | None:
    """Find the ``main`` another distribution registers for ``fairq NAME``, if installed."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="fairq.commands", name=name):
        loaded: Callable[[list[str]], int] = entry.load()
        return loaded
    return None


# Imported on use: the operator tools need only the server's own dependencies.
_TOOLS = {
    "health": "fairq_server.tools.health",
    "keys": "fairq_server.tools.keys",
    "teams": "fairq_server.tools.teams",
    "limits": "fairq_server.tools.limits",
    "audit": "fairq_server.tools.audit",
    "usage": "fairq_server.tools.usage",
    "db": "fairq_server.tools.db",
    "top": "fairq_server.tools.top",
    "envoy": "fairq_server.doors.extproc.command",
}
# Commands other distributions bring (entry points in group ``fairq.commands``): the service
# never imports the simulator or the benchmarks.
_PLUGIN_PACKAGES = {"sim": "fairq-sim", "demo": "fairq-bench", "bench": "fairq-bench"}
# Where each lives in a checkout (they are not on PyPI), with what pip cannot fetch for it.
_PLUGIN_FOLDERS = {"fairq-sim": "./sim", "fairq-bench": "./sim ./bench"}


if __name__ == "__main__":
    sys.exit(main())
