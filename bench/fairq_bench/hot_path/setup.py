"""The processes of the hot-path benchmark, each on its core.

fairq gets one core to itself; the zero-cost backend, Redis and the load generator (this
process) share the other, as a backend and its callers would sit on other hosts. What fairq
costs is then read from its own CPU time (``/proc``), not from wall time on a busy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import aiohttp
import grpc

from fairq_bench.cluster.setup import formed, replica_config
from fairq_bench.processes import child_process, confined, fairq_module_process, toml_config
from fairq_bench.redis_process import RedisProcess
from fairq_bench.targets import aiohttp_session, free_port

__all__ = [
    "HTTP_LIMITS",
    "TIERS",
    "Cores",
    "Door",
    "Stack",
    "cores",
    "hot_stack",
    "paced_backend",
    "pinned",
]

#: The gate's threshold on the backend's waiting queue. The default (3) counts fairq's own
#: requests without a first token: on this shared machine a first token can take tens of
#: milliseconds to come back, and three at a time then paces admission below the load (the
#: gate doing its job, not the relay's cost, which is what is measured here).
THRESHOLD = 64
#: The load opens every stream from one address: the HTTP door's per-peer cap (256 by
#: default, against one abusive client) must not refuse it.
HTTP_LIMITS = "max_connections_per_peer = 4096\nmax_connections = 8192\n"
TIERS = f'[[tiers]]\nname = "standard"\nmax_backend_waiting = {THRESHOLD}\n'


@dataclass(frozen=True)
class Cores:
    """fairq's core and everyone else's (``other`` empty on a one-CPU machine)."""

    fairq: set[int]
    other: set[int]


def cores() -> Cores:
    """The first usable CPU for fairq, the rest for the backend and the load."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return Cores(set(usable), set(usable))
    return Cores({usable[0]}, set(usable[1:]))


@contextlib.contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    """Children started inside run on ``cpus`` (they inherit this process's affinity)."""
    with confined(cpus):
        yield


@dataclass
class Door:
    """One fairq process (or replica) with both doors: its pid, gRPC target and HTTP base."""

    pid: int
    target: str
    http: str
    channel: grpc.aio.Channel


@dataclass
class Stack:
    """Everything running: the backend, one fairq alone and (optionally) three replicas."""

    backend: str
    session: aiohttp.ClientSession
    alone: Door
    replicas: list[Door] = field(default_factory=list)
    cores: Cores = field(default_factory=cores)


async def _door(stack: contextlib.AsyncExitStack, text: str, cpus: set[int], http: int) -> Door:
    with pinned(cpus):
        proc, target = await stack.enter_async_context(fairq_module_process(text))
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
    await channel.channel_ready()
    return Door(proc.pid, target, f"http://127.0.0.1:{http}", channel)


async def paced_backend(
    stack: contextlib.AsyncExitStack,
) -> tuple[Cores, str, aiohttp.ClientSession]:
    """Start the firehose paced like an engine (a token per stream every 10 ms) on ``stack``.

    This process moves to the backend's core until ``stack`` closes. Returns the cores, the
    backend's URL and a client session.
    """
    where = cores()
    stack.enter_context(pinned(where.other))
    argv = ["-m", "fairq_bench.scenarios.firehose", "--step-ms", "10", "--first-now"]
    _, backend = await stack.enter_async_context(child_process(argv, r"^(http://\S+)"))
    return where, backend, await stack.enter_async_context(aiohttp_session())


@contextlib.asynccontextmanager
async def hot_stack(replicas: int = 3) -> AsyncIterator[Stack]:
    """Start the backend, fairq alone and ``replicas`` replicas on Redis (0: none).

    This process runs on the backend's core while inside.
    """
    async with contextlib.AsyncExitStack() as stack:
        where, backend, session = await paced_backend(stack)
        http = free_port()
        text = toml_config(
            backend, "sim", "vllm", f'[http]\nlisten = "127.0.0.1:{http}"\n{HTTP_LIMITS}{TIERS}'
        )
        alone = await _door(stack, text, where.fairq, http)
        doors = []
        if replicas:
            redis = stack.enter_context(RedisProcess.running())  # on the load's core
            for i in range(replicas):
                http = free_port()
                text = replica_config(
                    backend, f"replica-{i}", redis.url, threshold=THRESHOLD,
                    extra=f'[http]\nlisten = "127.0.0.1:{http}"\n{HTTP_LIMITS}',
                )  # fmt: skip
                doors.append(await _door(stack, text, where.fairq, http))
            await formed(redis.url, replicas)
        await asyncio.sleep(0)
        yield Stack(backend, session, alone, doors, where)
