"""Child processes the scenarios need beyond ``fairq sim`` and ``fairq serve``.

Same rules as :mod:`fairq_bench.processes`: each child in its own process group (so
stopping reaches its children) but in the caller's session (a new session is a new scheduler
autogroup, which on a small machine starves the measuring client).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from fairq_bench.processes import stop_process

__all__ = ["child_process", "cpu_seconds", "fairq_module_process"]

_READY_TIMEOUT = 60.0


@contextlib.asynccontextmanager
async def child_process(
    argv: Sequence[str], pattern: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """Run ``python ARGV``; yield the process and group 1 of its first stdout line matching."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stderr=log, process_group=0
    )
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
        argv = [*module, "--log-level", "WARNING", "serve", "--config", str(path), "--grace", "2"]
        async with child_process(argv, r"\(port (\d+)\)") as (proc, port):
            yield proc, f"127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
