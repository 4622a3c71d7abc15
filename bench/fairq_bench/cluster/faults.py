"""Faults in a cluster, each judged the same way: nothing lost on the surviving replicas and
the backend queue back at (never far above) the threshold.

* ``kill``: SIGKILL one of three replicas mid-flood; its slots must free within a lease;
* ``redis``: stop Redis mid-flood for a while, restart it empty; replicas run on their
  local share meanwhile and return to the shared gate;
* ``sigstop``: SIGSTOP a replica for longer than a lease; its slots free while it is
  stopped, the other replica goes on, and after SIGCONT it finishes its own requests.

A lease cannot cover a request its replica reserved but had not yet sent when stopped: its
lease runs out, the other replica takes the slot, and on SIGCONT the request still goes out
(a vLLM backend cannot refuse a stale reservation). The stop is sent the moment the target
holds a slot, so such requests are likely, more so on a busy machine where sending takes
longer. They are the fault's own overshoot, bounded by the target's reservations at the stop
(``held_at_fault``); "after recovery" starts once the backend queue is back at the threshold
(those requests started), and from then on it must stay there.

Used at full size by ``python -m fairq_bench.cluster faults`` and reduced by
``tests/cluster/test_faults.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from fairq_bench.cluster.setup import QueueWatcher, by_replica, running_cluster
from fairq_bench.redis_process import RedisProcess
from fairq_bench.report import markdown_table
from fairq_bench.workload import RequestResult, RequestSpec, replay
from fairq_server.cluster.connection import server_ms

__all__ = ["FaultResult", "faults_markdown", "live_slots", "run_faults", "scenario"]

THRESHOLD = 3


@dataclass(frozen=True)
class FaultResult:
    """What one fault scenario measured."""

    name: str
    requests: int
    survivor_errors: int  # requests on replicas that were not the fault's target
    target_errors: int  # requests on the faulted replica (UNAVAILABLE expected for kill)
    peak_waiting: float  # backend queue, whole run
    peak_after: float  # backend queue after recovery
    started_after: int  # requests whose first token came after recovery (peak_after's traffic)
    slots_freed_seconds: float  # fault -> the target's slots gone from Redis (nan: n/a)
    recovered_seconds: float  # fault end -> every replica back on the shared gate (nan: n/a)
    lease_seconds: float
    held_at_fault: int = 0  # the target's live reservations when the fault hit (sigstop)
    settled_seconds: float = 0.0  # fault end -> backend queue back at the threshold (sigstop)


async def live_slots(redis_url: str, replica: str, backend: str = "sim") -> int:
    """Count ``replica``'s unexpired reservations on ``backend`` in Redis."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        now = await server_ms(client)
        members = await client.zrangebyscore(f"fairq:gate:{backend}:flight", f"({now}", "+inf")
        names = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
        return sum(1 for m in names if m.startswith(f"{replica}|"))
    finally:
        await client.aclose()


async def _replicas_alive(redis_url: str) -> int:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return int(await client.zcount("fairq:replicas", f"({await server_ms(client)}", "+inf"))
    finally:
        await client.aclose()


async def _until(predicate: object, timeout: float) -> float:
    """Seconds until the async ``predicate`` holds (nan if it does not within ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        with contextlib.suppress(Exception):
            if await predicate():  # type: ignore[operator]
                return time.monotonic() - start
        await asyncio.sleep(0.02)
    return float("nan")


def _specs(replicas: int, per_replica: int, tokens: int) -> list[RequestSpec]:
    return [
        RequestSpec(f"user-{r}", f"Request {i} to replica {r}.", tokens)
        for r in range(replicas)
        for i in range(per_replica)
    ]


async def scenario(name: str, *, quick: bool) -> FaultResult:
    """Run fault scenario ``name`` (``kill``, ``redis`` or ``sigstop``)."""
    lease = 1.0 if quick else 3.0
    replicas = 3 if name == "kill" else 2
    # The flood outlasts the fault and the recovery, so that the gate is seen working again.
    if name == "kill":
        per_replica, tokens = (8, 60) if quick else (30, 200)
    else:
        per_replica, tokens = (24, 200) if quick else (90, 200)
    target = replicas - 1
    specs = _specs(replicas, per_replica, tokens)
    with RedisProcess.running() as redis:
        async with running_cluster(
            replicas, True, max_num_seqs=4, redis=redis, lease_seconds=lease, threshold=THRESHOLD
        ) as cluster:
            watcher = QueueWatcher(cluster.backend_url)
            watcher.start()
            pick = {f"user-{r}": r for r in range(replicas)}
            began = time.monotonic()
            flood = asyncio.create_task(replay(specs, by_replica(cluster.senders, pick)))
            victim = f"replica-{target}"
            await _until(lambda: _has_slots(redis.url, victim), 30)
            freed = recovered = float("nan")
            held, settled = 0, 0.0
            proc = cluster.procs[target]
            if name == "kill":
                os.killpg(proc.pid, signal.SIGKILL)
                freed = await _until(lambda: _no_slots(redis.url, victim), 5 * lease)
            elif name == "sigstop":
                held = await live_slots(redis.url, victim)
                os.killpg(proc.pid, signal.SIGSTOP)
                # Stopped, it adds none; read again within its lease for any added meanwhile.
                held = max(held, await live_slots(redis.url, victim))
                freed = await _until(lambda: _no_slots(redis.url, victim), 5 * lease)
                await asyncio.sleep(max(0.0, 2.5 * lease - (freed if freed == freed else 0)))
                os.killpg(proc.pid, signal.SIGCONT)
                recovered = await _until(lambda: _alive_is(redis.url, replicas), 10 * lease)
            elif name == "redis":
                redis.stop()
                await asyncio.sleep(3.0 if quick else 10.0)
                redis.start()  # empty: persistence is off
                recovered = await _until(lambda: _alive_is(redis.url, replicas), 10 * lease)
            after = time.monotonic()
            results: list[RequestResult] = await flood
            await watcher.stop()
    if name == "sigstop":  # past the requests the target sent late (see the module's notes)
        back = watcher.settled(after, THRESHOLD)
        settled, after = back - after, back
    on_target = [r for r in results if r.spec.user == f"user-{target}"]
    others = [r for r in results if r.spec.user != f"user-{target}"]
    return FaultResult(
        name=name,
        requests=len(results),
        survivor_errors=sum(1 for r in others if r.error),
        target_errors=sum(1 for r in on_target if r.error),
        peak_waiting=watcher.peak(),
        peak_after=watcher.peak(after),
        started_after=sum(
            1 for r in results if r.first_token is not None and began + r.first_token > after
        ),
        slots_freed_seconds=freed,
        recovered_seconds=recovered,
        lease_seconds=lease,
        held_at_fault=held,
        settled_seconds=settled,
    )


async def _has_slots(url: str, replica: str) -> bool:
    return await live_slots(url, replica) > 0


async def _no_slots(url: str, replica: str) -> bool:
    return await live_slots(url, replica) == 0


async def _alive_is(url: str, n: int) -> bool:
    return await _replicas_alive(url) >= n


async def run_faults(*, quick: bool) -> list[FaultResult]:
    """Every scenario, one after the other."""
    out = []
    for name in ("kill", "redis", "sigstop"):
        result = await scenario(name, quick=quick)
        print(f"  {result}", flush=True)
        out.append(result)
    return out


def faults_markdown(results: list[FaultResult]) -> str:
    """One row per scenario."""
    rows = [
        (
            r.name,
            r.requests,
            r.survivor_errors,
            r.target_errors,
            f"{r.peak_waiting:g} / {r.peak_after:g}",
            r.started_after,
            f"{r.slots_freed_seconds:.2f} s"
            if r.slots_freed_seconds == r.slots_freed_seconds
            else "-",
            f"{r.recovered_seconds:.2f} s" if r.recovered_seconds == r.recovered_seconds else "-",
            f"{r.lease_seconds:g} s",
        )
        for r in results
    ]
    header = ("fault", "requests", "errors on survivors", "errors on the target",
              "backend waiting peak (run / after recovery)", "requests started after recovery",
              "target's slots freed after",
              "all replicas back after", "lease")  # fmt: skip
    return markdown_table(header, rows) + f"\n\nTier threshold {THRESHOLD}."
