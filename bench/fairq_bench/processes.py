"""Running the simulator and fairq as child processes, the way they run in production.

Benchmarks keep the load generator, fairq and the backend in separate processes so that none
of them steals the other's event loop, and so fairq's cost is measured as a real hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

__all__ = [
    "child_process",
    "confined",
    "cpu_seconds",
    "fairq_module_process",
    "fairq_process",
    "sim_process",
    "split_cpus",
    "stop_process",
    "toml_config",
]

_READY_TIMEOUT = 60.0


@contextlib.asynccontextmanager
async def child_process(
    argv: Sequence[str], pattern: str, python: str = sys.executable, cpus: Sequence[int] = ()
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """Run ``python ARGV``; yield the process and group 1 of its first stdout line matching.

    ``cpus`` confines the child (and every thread it starts) to those CPUs. Leaving stops it.
    """
    # stderr goes to a file: a pipe nobody drains would block a chatty child.
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    proc = await asyncio.create_subprocess_exec(
        *pin, python, *argv,
        stdout=asyncio.subprocess.PIPE, stderr=log,
        # Own process group (so stop reaches every child) but not a new session: a new session
        # is a new scheduler autogroup, which on a small machine starves the measuring client.
        process_group=0,
    )  # fmt: skip
    assert proc.stdout is not None
    found = ""
    try:
        async with asyncio.timeout(_READY_TIMEOUT):
            while line := (await proc.stdout.readline()).decode():
                if match := re.search(pattern, line):
                    found = match.group(1)
                    break
    except TimeoutError:
        pass
    try:
        if not found:
            log.seek(0)
            err = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(argv[:3])} did not start: {err}")
        yield proc, found
    finally:
        await stop_process(proc, timeout=15)
        log.close()


def split_cpus() -> tuple[tuple[int, ...], set[int]]:
    """Return a CPU for the backend and the others for everyone else (both empty on one CPU).

    A backend that shares its CPU with fairq and the load generator slows down whenever they
    work, which then dominates any comparison; on separate hosts it would not.
    """
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return (), set()
    return (usable[0],), set(usable[1:])


@contextlib.contextmanager
def confined(cpus: set[int]) -> Iterator[None]:
    """Run this process, and the children it starts meanwhile, on ``cpus`` (empty: anywhere)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def stop_process(proc: asyncio.subprocess.Process, timeout: float = 10.0) -> None:
    """SIGTERM ``proc``'s process group; SIGKILL it after ``timeout`` seconds."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


@contextlib.asynccontextmanager
async def sim_process(*args: str, cpus: Sequence[int] = ()) -> AsyncIterator[str]:
    """Run ``fairq sim ARGS --port 0`` (on ``cpus`` if given) and yield its base URL."""
    argv = ["-m", "fairq_server", "sim", "--port", "0", *args]
    async with child_process(argv, r"^(http://\S+)", cpus=cpus) as (_, url):
        yield url


def toml_config(backend_url: str, model: str, kind: str, extra: str = "") -> str:
    """A minimal open-mode fairq configuration with one backend, listening on a free port.

    ``kind`` is a backend kind, or ``sglang`` / ``llamacpp``: the OpenAI-compatible kind with
    that engine's metric names (the simulator's SGLang mode; a real ``llama-server``).
    """
    if kind in ("sglang", "llamacpp"):
        kind = f'openai"\nmetrics_preset = "{kind}'
    return (
        'listen = "127.0.0.1:0"\n'
        f"{extra}\n"
        "[[backends]]\n"
        'id = "backend-0"\n'
        f'kind = "{kind}"\n'
        f'base_url = "{backend_url}"\n'
        f'models = ["{model}"]\n'
    )


@contextlib.asynccontextmanager
async def fairq_process(config_text: str, python: str = sys.executable) -> AsyncIterator[str]:
    """Run ``fairq serve`` with ``config_text`` and yield its gRPC target.

    ``python`` may name another checkout's interpreter, to compare two versions of fairq.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fairq.toml"
        path.write_text(config_text)
        argv = ["-m", "fairq_server", *_serve_args(path)]
        async with child_process(argv, r"\(port (\d+)\)", python) as (_, port):
            yield f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def fairq_module_process(
    config_text: str, module: Sequence[str] = ("-m", "fairq_server")
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """Run ``python MODULE serve`` with ``config_text``; yield the process and gRPC target.

    ``module`` lets a scenario run fairq under a profiler.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fairq.toml"
        path.write_text(config_text)
        argv = [*module, *_serve_args(path)]
        async with child_process(argv, r"\(port (\d+)\)") as (proc, port):
            yield proc, f"127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run_seconds(pid: int) -> float:
    """Seconds process ``pid``'s live threads have run so far, to the nanosecond.

    ``/proc/<pid>/stat`` counts CPU in clock ticks (10 ms here), too coarse for a cost of a
    few ms per second measured over windows of seconds; the scheduler's own run time per
    thread (``/proc/<pid>/task/*/schedstat``) is exact. Threads that have exited drop out of
    the sum, so this is for differences over windows in which the process's threads live on
    (its event loop's, above all). Falls back to :func:`cpu_seconds` where the kernel keeps no
    schedstat.
    """
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just exited
                total += int((task / "schedstat").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return cpu_seconds(pid)
    return total / 1e9


def _serve_args(config: Path) -> list[str]:
    """The arguments after ``fairq`` that serve ``config`` quietly, with a short grace."""
    return ["--log-level", "WARNING", "serve", "--config", str(config), "--grace", "2"]
