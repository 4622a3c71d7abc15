"""A cluster on one machine: redis-server, a simulated backend and N fairq replicas, each a
child process; plus the backend-queue watcher the benchmarks judge the shared gate by.

The simulator gets a CPU of its own and everything else (Redis, the replicas, the load
generator) the others, as a backend on its own host would: otherwise every replica added
takes CPU from the backend, and the comparison measures that instead of the scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import aiohttp
import grpc
import redis.asyncio as aioredis

from fairq_bench.processes import confined, fairq_module_process, sim_process, split_cpus
from fairq_bench.redis_process import RedisProcess
from fairq_bench.targets import fairq_sender
from fairq_bench.workload import RequestSpec, SendFn
from fairq_server.cluster.connection import server_ms

__all__ = ["Cluster", "QueueWatcher", "by_replica", "replica_config", "running_cluster"]

_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.MULTILINE)
_PEAK = re.compile(r"^fairq_sim_num_requests_waiting_peak (\S+)$", re.MULTILINE)


def replica_config(
    backend_url: str,
    replica: str,
    redis_url: str | None,
    *,
    fairness: str = "round-robin",
    threshold: int = 3,
    lease_seconds: float = 5.0,
    poll_interval: float = 0.5,
    extra: str = "",
) -> str:
    """The configuration of one replica (``redis_url`` None: no ``[cluster]``).

    Each replica scrapes the backend on its own, so the backend renders ``/metrics`` once
    per replica per ``poll_interval`` (the default, 0.5 s, unless a scenario says otherwise).
    """
    text = (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\n"
        f'fairness = "{fairness}"\n'
        f"poll_interval_seconds = {poll_interval}\n"
        "[[tiers]]\n"
        'name = "standard"\n'
        f"max_backend_waiting = {threshold}\n"
        "tpot_limit_seconds = 1.0\n"
        "[[backends]]\n"
        'id = "sim"\n'
        'kind = "vllm"\n'
        f'base_url = "{backend_url}"\n'
        'models = ["sim"]\n'
        f"{extra}\n"
    )
    if redis_url is not None:
        text += (
            "[cluster]\n"
            f'redis_url = "{redis_url}"\n'
            f'replica_id = "{replica}"\n'
            f"lease_seconds = {lease_seconds}\n"
        )
    return text


@dataclass
class QueueWatcher:
    """Watches the simulated backend's waiting queue.

    Samples ``vllm:num_requests_waiting`` every ``every`` seconds (for what happened when) and
    the simulator's exact peak after any engine step (``fairq_sim_num_requests_waiting_peak``,
    which sampling alone could miss). Reads with aiohttp: this runs on the CPU fairq uses.
    """

    url: str
    every: float = 0.2
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _sample(self, session: aiohttp.ClientSession) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(self.url + "/metrics") as response:
                text = await response.text()
            waiting, peak = _WAITING.search(text), _PEAK.search(text)
            if waiting and peak:
                sample = (time.monotonic(), float(waiting.group(1)), float(peak.group(1)))
                self.samples.append(sample)

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self._sample(session)
                await asyncio.sleep(self.every)

    def start(self) -> None:
        """Start sampling (from scratch)."""
        self.samples.clear()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Take a last sample, then stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as s:
                await self._sample(s)

    def settled(self, since: float, threshold: float) -> float:
        """The first sample time at or after ``since`` with the queue at or below ``threshold``.

        ``inf`` if it never came back there (then :meth:`peak` from it finds nothing, so a
        caller must check).
        """
        return next((t for t, w, _ in self.samples if t >= since and w <= threshold), math.inf)

    def peak(self, since: float = 0.0) -> float:
        """The longest waiting queue at or after ``since`` (monotonic).

        The sampled values, and the simulator's exact peak wherever it rose within the window
        (a rise there is a new maximum reached there).
        """
        before = [p for t, _, p in self.samples if t < since]
        window = [(w, p) for t, w, p in self.samples if t >= since]
        if not window:
            return 0.0
        sampled = max(w for w, _ in window)
        exact = window[-1][1]
        risen = not before or exact > before[-1]
        return max(sampled, exact) if risen else sampled


@dataclass
class Cluster:
    """Running replicas: their processes, targets and one channel and sender each."""

    backend_url: str
    redis: RedisProcess | None
    procs: list[asyncio.subprocess.Process]
    targets: list[str]
    channels: list[grpc.aio.Channel]
    senders: list[SendFn]


@contextlib.asynccontextmanager
async def running_cluster(
    replicas: int,
    coordinated: bool,
    *,
    max_num_seqs: int = 8,
    speed: float = 1.0,
    backend_url: str | None = None,
    redis: RedisProcess | None = None,
    **config: object,
) -> AsyncIterator[Cluster]:
    """Start (or reuse) a simulator and Redis, then ``replicas`` fairq processes.

    A simulator started here runs on a CPU of its own; the rest, and the caller while inside,
    on the others.
    """
    async with contextlib.AsyncExitStack() as stack:
        if backend_url is None:
            sim_cpus, other_cpus = split_cpus()
            backend_url = await stack.enter_async_context(
                sim_process(
                    "--max-num-seqs", str(max_num_seqs), "--speed", str(speed), cpus=sim_cpus
                )
            )
            stack.enter_context(confined(other_cpus))
        if coordinated and redis is None:
            redis = stack.enter_context(RedisProcess.running())
        redis_url = redis.url if coordinated and redis is not None else None
        procs, targets, channels, senders = [], [], [], []
        for i in range(replicas):
            text = replica_config(backend_url, f"replica-{i}", redis_url, **config)  # type: ignore[arg-type]
            proc, target = await stack.enter_async_context(fairq_module_process(text))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
            procs.append(proc)
            targets.append(target)
            channels.append(channel)
            senders.append(fairq_sender(channel, "sim"))
        if redis_url is not None:
            await formed(redis_url, replicas)
        yield Cluster(backend_url, redis, procs, targets, channels, senders)


async def formed(redis_url: str, replicas: int, timeout: float = 30.0) -> None:
    """Wait until every replica has counted all ``replicas`` (its own view of the cluster).

    A replica counts the others at its heartbeats, so one started first counts the later
    ones only at its next beat; a fault before then would find it alone, with a local share
    of the whole backend. A beat stores the replica's lease expiry and reads the count in one
    pipeline: once every member's expiry is above the latest expiry seen when all were
    first present, each has beaten, and counted them all, since.
    """
    client = aioredis.Redis.from_url(redis_url)
    try:
        async with asyncio.timeout(timeout):
            key, since = "fairq:replicas", None
            while True:
                now = await server_ms(client)
                rows = await client.zrangebyscore(key, f"({now}", "+inf", withscores=True)
                expiries = [float(row[1]) for row in cast(list[tuple[bytes, float]], rows)]
                if since is None and len(expiries) >= replicas:
                    since = max(expiries)
                elif since is not None and expiries and min(expiries) > since:
                    return
                await asyncio.sleep(0.02)
    finally:
        await client.aclose()


def by_replica(senders: Sequence[SendFn], pick: dict[str, int]) -> SendFn:
    """Return a sender to the replica ``pick`` names per user; others' requests rotate."""
    counters: dict[str, int] = {}

    def send(spec: RequestSpec) -> AsyncIterator[str]:
        target = pick.get(spec.user)
        if target is None:  # spread over the replicas, one after the other
            n = counters.get(spec.user, 0)
            counters[spec.user] = n + 1
            target = n % len(senders)
        return senders[target](spec)

    return send
