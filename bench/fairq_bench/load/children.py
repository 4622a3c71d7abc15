"""Child processes of a load run: fairq, the simulator and the helpers, each in its own
process group, started with ``python -m`` and read from outside (``/proc/<pid>``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "ChildProcess",
    "free_port",
    "process_group_alive",
    "start_child",
    "start_fairq",
    "start_sim",
]

_READY_TIMEOUT = 60.0


@dataclass
class ChildProcess:
    """A ``python -m fairq_server ...`` child in its own process group.

    Attributes:
        proc: the process.
        address: what it printed when ready (the sim's URL, fairq's ``host:port`` target).
        args: its command-line arguments after ``-m fairq_server``.
        log: its stderr, kept in a temporary file (a pipe nobody drains would block it).
        workdir: a directory that lives as long as the child (fairq's configuration file).

    """

    proc: asyncio.subprocess.Process
    address: str
    args: tuple[str, ...]
    log: IO[bytes]
    workdir: tempfile.TemporaryDirectory[str] | None = None
    metrics_url: str = ""
    drainer: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """Process id (also the process group id)."""
        return self.proc.pid

    def rss_bytes(self) -> int:
        """Resident set size from ``/proc/<pid>/status`` (VmRSS)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no VmRSS for pid {self.pid}")
        return int(match.group(1)) * 1024

    def cpu_seconds(self) -> float:
        """User + system CPU time consumed so far, from ``/proc/<pid>/stat``."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stderr_tail(self, chars: int = 3000) -> str:
        """The end of what the child wrote to stderr."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-chars:]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group: the crash of a backend, no goodbye on any socket."""
        self.signal(signal.SIGKILL)

    async def wait(self, timeout: float) -> int:
        """Wait for the child to exit and return its exit status.

        Raises:
            TimeoutError: it is still running after ``timeout`` seconds.

        """
        async with asyncio.timeout(timeout):
            return await self.proc.wait()

    async def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit status."""
        if self.proc.returncode is None:
            self.signal(signal.SIGTERM)
            try:
                await self.wait(timeout)
            except TimeoutError:
                self.kill()
                await self.proc.wait()
        if self.drainer is not None:
            await self.drainer
        if self.workdir is not None:
            self.workdir.cleanup()
        self.log.close()
        assert self.proc.returncode is not None
        return self.proc.returncode


def process_group_alive(pgid: int) -> bool:
    """Whether any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


async def start_child(
    args: Sequence[str],
    ready: str,
    *,
    workdir: tempfile.TemporaryDirectory[str] | None = None,
    module: str = "fairq_server",
    env: Mapping[str, str] | None = None,
    ready_timeout: float = _READY_TIMEOUT,
) -> ChildProcess:
    """Start ``python -m MODULE ARGS`` and wait for a stdout line matching ``ready``.

    The child gets its own process group (signals reach all of it) but stays in our session:
    a new session is a new scheduler autogroup, which on a small machine starves this process.
    ``env`` is added to this process's environment (e.g. ``PYTHONPATH`` to run another
    checkout of fairq).

    Raises:
        RuntimeError: the child exited or printed nothing matching within ``ready_timeout`` seconds.

    """
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        process_group=0,
        env={**os.environ, **env} if env else None,
    )
    child = ChildProcess(proc, "", tuple(args), log, workdir)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(ready_timeout):
            while line := (await proc.stdout.readline()).decode():
                if match := re.search(ready, line):
                    child.address = match.group(1)
                    break
    except TimeoutError:
        pass
    if not child.address:
        err = child.stderr_tail()
        await child.stop()
        raise RuntimeError(f"fairq {args[0]} did not start: {err}")
    # The children print little after their ready line, but a pipe left unread would block
    # a chatty one, so keep draining it.
    child.drainer = asyncio.create_task(_drain(proc.stdout))
    return child


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def start_sim(*args: str, port: int = 0) -> ChildProcess:
    """Run ``fairq sim ARGS`` on ``port`` (0 = a free one); ``address`` is its base URL."""
    return await start_child(["sim", "--port", str(port), *args], r"^(http://\S+)")


async def start_fairq(
    config_text: str,
    *,
    grace: float = 2.0,
    metrics: bool = False,
    log_level: str = "WARNING",
    env: Mapping[str, str] | None = None,
    ready_timeout: float = _READY_TIMEOUT,
) -> ChildProcess:
    """Run ``fairq serve`` with ``config_text``; ``address`` is its gRPC target.

    With ``metrics``, ``metrics_listen`` is set to a free loopback port (prepended to the
    configuration, which must not set it) and ``metrics_url`` points at its ``/metrics``.
    """
    metrics_url = ""
    if metrics:
        port = free_port()
        config_text = f'metrics_listen = "127.0.0.1:{port}"\n{config_text}'
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    workdir = tempfile.TemporaryDirectory(prefix="fairq-load-")
    path = Path(workdir.name) / "fairq.toml"
    path.write_text(config_text)
    child = await start_child(
        ["--log-level", log_level, "serve", "--config", str(path), "--grace", str(grace)],
        r"\(port (\d+)\)",
        workdir=workdir,
        env=env,
        ready_timeout=ready_timeout,
    )
    child.address = f"127.0.0.1:{child.address}"
    child.metrics_url = metrics_url
    return child


def free_port() -> int:
    """A TCP port free on loopback right now (another process could take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
