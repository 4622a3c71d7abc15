"""The processes of an engine running on this machine, found by the port it listens on.

A benchmark against a local engine can then read the engine's own CPU over a run: on a CPU
engine whose processes share a core, that CPU is the wall clock, so a client that makes the
engine work more per step shows there, apart from the scheduling.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlsplit

from fairq_bench.processes import run_seconds

__all__ = ["engine_pids", "listening_pid", "tree", "tree_run_seconds"]

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp
_LOCAL = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def listening_pid(port: int) -> int | None:
    """The process that holds a socket listening on TCP ``port`` here (None: none found)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone, or not ours to read
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if fd.readlink().as_posix() in inodes:
                        return int(proc.name)
    return None


def tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (an engine's core and workers)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def engine_pids(url: str) -> list[int]:
    """The processes of the engine at ``url`` if it runs here, else none."""
    parts = urlsplit(url)
    if parts.hostname not in _LOCAL or parts.port is None:
        return []
    pid = listening_pid(parts.port)
    return tree(pid) if pid is not None else []


def tree_run_seconds(pids: list[int]) -> float:
    """The run time so far of ``pids``' live threads, summed (a process gone counts 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += run_seconds(pid)
    return total
