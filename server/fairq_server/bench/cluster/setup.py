"""A cluster on one machine: redis-server, a simulated backend and N fairq replicas, each a
child process; plus the backend-queue watcher the benchmarks judge the shared gate by."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
import httpx

from fairq_server.bench.processes import sim_process
from fairq_server.bench.scenarios.procs import fairq_module_process
from fairq_server.bench.targets import fairq_sender
from fairq_server.bench.workload import RequestSpec, SendFn
from fairq_server.cluster.redis_process import RedisProcess

__all__ = ["Cluster", "QueueWatcher", "by_replica", "replica_config", "running_cluster"]

_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.MULTILINE)


def replica_config(
    backend_url: str,
    replica: str,
    redis_url: str | None,
    *,
    fairness: str = "round-robin",
    threshold: int = 3,
    lease_seconds: float = 5.0,
    extra: str = "",
) -> str:
    """The configuration of one replica (``redis_url`` None: no ``[cluster]``)."""
    text = (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\n"
        f'fairness = "{fairness}"\n'
        "poll_interval_seconds = 0.1\n"
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
            "refresh_seconds = 0.05\n"
        )
    return text


@dataclass
class QueueWatcher:
    """Samples the backend's waiting queue (its /metrics) every ``every`` seconds."""

    url: str
    every: float = 0.01
    samples: list[tuple[float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    text = (await client.get(self.url + "/metrics")).text
                    match = _WAITING.search(text)
                    if match:
                        self.samples.append((time.monotonic(), float(match.group(1))))
                await asyncio.sleep(self.every)

    def start(self) -> None:
        """Start sampling (from scratch)."""
        self.samples.clear()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def peak(self, since: float = 0.0) -> float:
        """The largest waiting count sampled at or after ``since`` (monotonic)."""
        return max((v for t, v in self.samples if t >= since), default=0.0)


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
    backend_url: str | None = None,
    redis: RedisProcess | None = None,
    **config: object,
) -> AsyncIterator[Cluster]:
    """Start (or reuse) a simulator and Redis, then ``replicas`` fairq processes."""
    async with contextlib.AsyncExitStack() as stack:
        if backend_url is None:
            backend_url = await stack.enter_async_context(
                sim_process("--max-num-seqs", str(max_num_seqs))
            )
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
        yield Cluster(backend_url, redis, procs, targets, channels, senders)


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
