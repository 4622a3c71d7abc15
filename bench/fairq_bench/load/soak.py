"""Phase 2, soak with faults: open-loop traffic in rounds, each with one fault injected into a
backend (killed, erroring, failing or slow metrics); fairq must be quiet after every round,
and per-user state must not outlive its users (the churn batch at the end)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field

import grpc
import httpx

from fairq_bench.load.children import ChildProcess, start_fairq, start_sim
from fairq_bench.load.driver import Outcome, Spec, Tally, channels, prompt_for, send
from fairq_bench.load.metrics import fairq_quiet, scrape, total
from fairq_bench.load.prober import Prober, ProbeStats
from fairq_bench.load.sizes import ADMISSION_WINDOW, MODEL, PROFILE, LoadSize

__all__ = ["FAULTS", "RoundResult", "SoakResult", "soak"]

FAULTS = ("none", "kill", "error-rate", "metrics-fail", "kill", "slow-metrics")


@dataclass(frozen=True)
class RoundResult:
    """One soak round: its fault, what clients saw, and fairq's state once quiet again."""

    index: int
    fault: str
    victim: str
    codes: Counter[str]
    violations: int
    sent: int
    reached_server: int
    server_outcomes: float
    unavailable: Counter[str]
    repeated_started: int
    rss: int
    probe: ProbeStats
    examples: dict[str, str] = field(default_factory=dict)
    deadline_races: int = 0
    violation_examples: tuple[Outcome, ...] = ()

    @property
    def counted_ok(self) -> bool:
        """fairq counted every request that reached it, and no more than were sent."""
        return self.reached_server <= self.server_outcomes <= self.sent


@dataclass
class SoakResult:
    """Figures of the soak."""

    size: LoadSize
    rounds: list[RoundResult] = field(default_factory=list)
    quiet_every_round: bool = True
    churn_users: int = 0
    churn_rss_known: int = 0
    churn_rss_delta: int = 0

    @property
    def rss_growth(self) -> int:
        """Resident memory after the last round minus after the first (warm-up) round."""
        return self.rounds[-1].rss - self.rounds[0].rss if self.rounds else 0


class _Backend:
    """A simulator child that can be killed and restarted on the same port."""

    def __init__(self, name: str, speed: float) -> None:
        self.name = name
        self.speed = speed
        self.port = 0
        self.child: ChildProcess | None = None

    async def start(self, *faults: str) -> None:
        self.child = await start_sim(
            "--profile", PROFILE, "--speed", str(self.speed), *faults, port=self.port
        )
        self.port = int(self.child.address.rsplit(":", 1)[1])

    async def restart(self, *faults: str) -> None:
        if self.child is not None:
            await self.child.stop()
        await self.start(*faults)

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()

    async def stop(self) -> None:
        if self.child is not None:
            await self.child.stop()


def _soak_config(urls: Sequence[tuple[str, str]]) -> str:
    backends = "".join(
        f'[[backends]]\nid = "{name}"\nkind = "vllm"\nbase_url = "{url}"\nmodels = ["{MODEL}"]\n'
        for name, url in urls
    )
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\nqueue_ttl_seconds = 20.0\nstale_after_seconds = 1.0\n" + backends
    )


async def _fault(kind: str, victim: _Backend, seconds: float) -> None:
    """Apply ``kind`` to ``victim`` for about ``seconds``, then heal it."""
    if kind == "none":
        return
    if kind == "kill":
        victim.kill()
        await asyncio.sleep(min(2.0, seconds))  # the backend stays dead this long
        await victim.restart()
        return
    flags = {
        "error-rate": ("--error-rate", "0.5"),
        "metrics-fail": ("--metrics-fail",),
        "slow-metrics": ("--metrics-delay", "3"),
    }[kind]
    await victim.restart(*flags)
    await asyncio.sleep(seconds)  # the fault lasts this long
    await victim.restart()


async def _all_healthy(http: httpx.AsyncClient, metrics_url: str, count: int) -> None:
    """Wait (at most 30 s) until fairq reports all ``count`` backends healthy."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            while True:
                if total(await scrape(http, metrics_url), "fairq_backend_healthy") >= count:
                    return
                await asyncio.sleep(0.2)  # another process's state: nothing to await


def _soak_spec(rng: random.Random, users: Sequence[str]) -> Spec:
    user = rng.choice(users)
    roll = rng.random()
    if roll < 0.1:
        return Spec(user, rng.randint(16, 64), cancel_after=rng.randint(1, 8))
    if roll < 0.2:
        return Spec(user, rng.randint(8, 64), timeout=rng.uniform(0.05, 1.5))
    return Spec(user, rng.randint(4, 48))


async def soak(size: LoadSize, log: Callable[[str], None] = print, seed: int = 1) -> SoakResult:
    """Open-loop traffic in rounds, each with one fault; fairq must be quiet after each."""
    rng = random.Random(seed)
    result = SoakResult(size)
    backends = [_Backend("sim-a", size.soak_speed), _Backend("sim-b", size.soak_speed)]
    for backend in backends:
        await backend.start()
    urls = [(b.name, f"http://127.0.0.1:{b.port}") for b in backends]
    fairq = await start_fairq(_soak_config(urls), metrics=True)
    prober = await Prober.start(fairq.address)
    chans = channels(fairq.address, size.channels)
    rounds = max(2, math.ceil(size.soak_seconds / size.round_seconds))
    try:
        async with httpx.AsyncClient() as http:
            before = total(await scrape(http, fairq.metrics_url), "fairq_requests_total")
            for index in range(rounds):
                fault = FAULTS[index % len(FAULTS)] if index else "none"
                victim = backends[index % 2]
                # New users every round: per-user state must not outlive its users.
                users = [f"soak-{index}-{u}" for u in range(max(4, size.users // 10))]
                tally = Tally()
                started = time.monotonic()
                tasks: list[asyncio.Task[Outcome]] = []
                fault_task = asyncio.create_task(
                    _delayed(
                        0.3 * size.round_seconds, _fault(fault, victim, 0.4 * size.round_seconds)
                    )
                )
                n = 0
                while time.monotonic() < started + size.round_seconds:
                    burst = 1 if rng.random() > 0.02 else int(size.soak_rate * 5)
                    for _ in range(burst):
                        spec = _soak_spec(rng, users)
                        tasks.append(
                            asyncio.create_task(
                                send(chans[n % len(chans)], spec, tally, prompt_for(spec.user, n))
                            )
                        )
                        n += 1
                    # Open loop: arrivals follow the clock, not completions.
                    await asyncio.sleep(rng.expovariate(size.soak_rate))
                await fault_task
                async with asyncio.timeout(120):
                    await asyncio.gather(*tasks)
                try:
                    samples = await fairq_quiet(http, fairq)
                except TimeoutError:
                    result.quiet_every_round = False
                    samples = await scrape(http, fairq.metrics_url)
                # The next round's fault is its own: the healed backend must be back first
                # (a restarted simulator takes seconds to start on a loaded machine).
                await _all_healthy(http, fairq.metrics_url, len(backends))
                served = total(samples, "fairq_requests_total")
                rss = fairq.rss_bytes()
                round_result = RoundResult(
                    index,
                    fault,
                    victim.name if fault != "none" else "-",
                    tally.codes,
                    len(tally.violations),
                    n,
                    tally.reached_server,
                    served - before,
                    tally.unavailable,
                    tally.repeated_started,
                    rss,
                    prober.stats(started, time.monotonic()),
                    tally.examples,
                    tally.deadline_races,
                    tuple(tally.violations[:3]),
                )
                before = served
                result.rounds.append(round_result)
                log(
                    f"soak round {index} ({fault} on {round_result.victim}): {n} requests, "
                    f"{dict(tally.codes)}, RSS {rss / 2**20:.1f} MiB, "
                    f"probe max {round_result.probe.max * 1000:.0f} ms"
                )
            if size.churn_users:
                result.churn_users = size.churn_users
                result.churn_rss_known, result.churn_rss_delta = await _churn(
                    http, fairq, chans, size.churn_users
                )
                log(
                    f"soak: {result.churn_users} one-request users: RSS "
                    f"{result.churn_rss_delta / 2**20:+.1f} MiB"
                )
    finally:
        for chan in chans:
            await chan.close()
        await prober.stop()
        await fairq.stop()
        for backend in backends:
            await backend.stop()
    return result


async def _churn(
    http: httpx.AsyncClient, fairq: ChildProcess, chans: Sequence[grpc.aio.Channel], users: int
) -> tuple[int, int]:
    """RSS growth of a quiet fairq over a batch of ``users`` requests from 8 known users, and
    over a batch of as many requests each from a user never seen before.

    The first batch runs twice and the second run is the one reported: any batch of this
    size grows the allocator's pools once. State kept per user after its last request would
    show as the difference between the two figures.
    """
    tally = Tally()
    admission = asyncio.Semaphore(ADMISSION_WINDOW)

    async def batch(user: Callable[[int], str]) -> int:
        await fairq_quiet(http, fairq)
        before = fairq.rss_bytes()
        await asyncio.gather(
            *(
                send(chans[i % len(chans)], Spec(user(i), 1), tally, prompt_for(user(i), i),
                     admission)
                for i in range(users)
            )
        )  # fmt: skip
        await fairq_quiet(http, fairq)
        return fairq.rss_bytes() - before

    await batch(lambda i: f"known-{i % 8}")
    known = await batch(lambda i: f"known-{i % 8}")
    return known, await batch(lambda i: f"churn-{i}")


async def _delayed(seconds: float, coro: Coroutine[None, None, None]) -> None:
    await asyncio.sleep(seconds)  # the fault's place in the round's schedule
    await coro
