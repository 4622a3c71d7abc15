"""Quotas through real replicas: three ``fairq serve`` processes, one ``redis-server``.

One simulated vLLM (``--eos-mean-tokens``, so outputs vary as real ones do, up to
``MAX_TOKENS``) serves two groups of three ``fairq serve`` processes at once:

- **shared**: three replicas with ``[cluster]`` on one real ``redis-server``;
- **uncoordinated**: three replicas without ``[cluster]`` (each counts alone).

Every replica has the same hard quota of ``QUOTA`` tokens per minute on the user ``ann``.
Through each group, ``ann`` keeps ``SLOTS`` gRPC requests going on every replica for
``MINUTES`` minutes; a refused request waits the ``grpc-retry-pushback-ms`` it was given and
asks again. Each granted request is counted at the moment its ``Started`` event arrives (the
dispatch, where the reservation is made) with the backend's own usage (prompt + output tokens
from its ``Finished`` event). A probe also asks each shared replica's HTTP door every few
seconds, to see the 429 side of a refusal. Reported: tokens in every minute (whole seconds,
as the book counts them) and in any 60 s interval (exact times), refusals and their retry
delays.

Then, on the shared group, a **soft** quota of ``SOFT_TPM`` tokens per minute on ``sid``,
put past its limit through replica 0 only: ``sid`` alone from all three replicas (its
tokens/s against an in-quota user's alone, same load), then behind three in-quota users
(one per replica, each backlogged): ``sid``'s share of the tokens, its errors (none expected),
and every replica's ``fairq_soft_band_dispatches_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc

from fairq import AsyncClient, Chunk, Finished, ResourceExhaustedError, Started
from fairq_bench.processes import confined, fairq_module_process, sim_process, split_cpus
from fairq_bench.redis_process import RedisProcess
from fairq_bench.scenarios.common import api_key
from fairq_bench.scenarios.soft_quota import share_of
from fairq_bench.targets import free_port
from fairq_server.identity.auth import hash_key

__all__ = [
    "ClusterRun",
    "Contended",
    "Probe",
    "SoftRun",
    "Traffic",
    "minute_peaks",
    "run_quota_cluster",
    "soft_share",
]

QUOTA = 3_000
MAX_TOKENS = 150
EOS_MEAN = 100  # the simulator's mean output length: outputs vary, capped at MAX_TOKENS
REPLICAS, SLOTS = 3, 4
MINUTES = 3
SOFT_TPM = 1_000
HARD, SOFT = "ann", "sid"
IN_QUOTA = ("in1", "in2", "in3")  # one per replica in the soft part
USERS = (HARD, SOFT, *IN_QUOTA)
SOFT_OUTSTANDING = 4  # sid's requests per replica
#: Each in-quota user's requests on its replica, one run each. The backend holds 16 running
#: and fairq lets 3 wait there, 19 in all: with 12 each, in-quota work waits in every
#: replica's queue all the time; with 8 each (24 in all), it waits, but not always on every
#: replica.
IN_OUTSTANDING = (12, 8)
SHARE_BOUND = 0.10


def _extra() -> str:
    lines = []
    for user in USERS:
        lines.append(f'[[keys]]\nuser = "{user}"\nsha256 = "{hash_key(api_key(user))}"')
    lines.append(f'[[quotas]]\nuser = "{HARD}"\ntokens_per_minute = {QUOTA}\nmode = "hard"')
    lines.append(f'[[quotas]]\nuser = "{SOFT}"\ntokens_per_minute = {SOFT_TPM}\nmode = "soft"')
    return "\n".join(lines)


@dataclass
class Replica:
    """A running replica: its gRPC channel, HTTP door and metrics port."""

    channel: grpc.aio.Channel
    http_port: int
    metrics_port: int
    clients: dict[str, AsyncClient] = field(default_factory=dict)

    def client(self, user: str) -> AsyncClient:
        """The user's client on this replica (its API key)."""
        if user not in self.clients:
            self.clients[user] = AsyncClient("", api_key=api_key(user), channel=self.channel)
        return self.clients[user]


@dataclass
class Probe:
    """One HTTP request of the probe: when, which replica, status, Retry-After, error code."""

    at: float
    replica: int
    status: int
    retry_after: str | None
    code: str | None


@dataclass
class ClusterRun:
    """One group's hard-quota run: grants (wall time, tokens), refusals, probes, errors."""

    name: str
    start: float
    seconds: float
    granted: list[tuple[float, int]] = field(default_factory=list)
    refusals: list[float | None] = field(default_factory=list)  # retry delays (s)
    refusal_codes: set[str] = field(default_factory=set)
    probes: list[Probe] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


def minute_peaks(granted: Sequence[tuple[float, int]], start: float, end: float) -> dict[str, Any]:
    """Tokens per minute: whole-second buckets (the book's window) and exact 60 s intervals.

    Returns ``rolling`` (tokens in the 60 whole seconds ending at each second from ``start``),
    ``bucketed`` (its most), ``exact`` (the most in any interval ``[t, t + 60)``) and
    ``minutes`` (tokens in each whole minute from ``start``).
    """
    first, last = int(start), int(end)
    per_second = [0] * (last - first + 1)
    for at, tokens in granted:
        if first <= at < last + 1:
            per_second[int(at) - first] += tokens
    rolling = [sum(per_second[max(0, s - 59) : s + 1]) for s in range(len(per_second))]
    events = sorted(granted)
    exact, j, inside = 0, 0, 0
    for at, tokens in events:
        inside += tokens
        while events[j][0] <= at - 60.0:
            inside -= events[j][1]
            j += 1
        exact = max(exact, inside)
    minutes = [
        sum(n for at, n in granted if start + 60 * m <= at < start + 60 * (m + 1))
        for m in range(int((end - start) // 60))
    ]
    return {"rolling": rolling, "bucketed": max(rolling, default=0), "exact": exact,
            "minutes": minutes}  # fmt: skip


async def _one(
    replica: Replica, user: str, prompt: str, chunks: list[float] | None = None
) -> tuple[float, int]:
    """Send one request; return (wall time of its Started event, prompt + output tokens).

    ``chunks`` gets the monotonic time of every chunk (one token each from the simulator).
    """
    started_at = 0.0
    events = replica.client(user).generate("sim", prompt, max_tokens=MAX_TOKENS)
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Chunk):
                if chunks is not None:
                    chunks.append(time.monotonic())
            elif isinstance(event, Started):
                started_at = time.time()
            elif isinstance(event, Finished):
                return started_at, event.prompt_tokens + event.completion_tokens
    raise RuntimeError("stream ended without Finished")


async def _hard_slot(replica: Replica, run: ClusterRun, until: float, seed: int) -> None:
    rng = random.Random(seed)
    i = 0
    while time.time() < until:
        i += 1
        try:
            at, tokens = await _one(replica, HARD, f"{HARD} {seed} {i}")
        except ResourceExhaustedError as exc:
            run.refusals.append(exc.retry_after)
            run.refusal_codes.add(exc.code.name)
            # A little jitter, as a client library adds: the slots do not all ask at once.
            await asyncio.sleep(max(exc.retry_after or 0.05, 0.05) + rng.uniform(0, 0.05))
            continue
        except Exception as exc:  # counted; never expected
            key = type(exc).__name__
            run.errors[key] = run.errors.get(key, 0) + 1
            await asyncio.sleep(0.1)
            continue
        run.granted.append((at, tokens))


async def _probe(replicas: Sequence[Replica], run: ClusterRun, until: float) -> None:
    """Every few seconds, a non-streamed request as ``ann`` through a replica's HTTP door."""
    body = {"model": "sim", "prompt": f"{HARD} probe", "max_tokens": MAX_TOKENS}
    headers = {"Authorization": f"Bearer {api_key(HARD)}"}
    n = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while time.time() < until - 5:
            await asyncio.sleep(4.0)
            r = n % len(replicas)
            n += 1
            sent = time.time()
            url = f"http://127.0.0.1:{replicas[r].http_port}/v1/completions"
            async with session.post(url, json=body, headers=headers) as resp:
                answer = await resp.json(content_type=None)
            code = (answer.get("error") or {}).get("code")
            run.probes.append(Probe(sent, r, resp.status, resp.headers.get("Retry-After"), code))
            if resp.status == 200:  # granted between sending and the answer: counted at send
                usage = answer["usage"]
                run.granted.append((sent, usage["prompt_tokens"] + usage["completion_tokens"]))


async def _hard(name: str, replicas: Sequence[Replica], seconds: float, probe: bool) -> ClusterRun:
    run = ClusterRun(name, time.time(), seconds)
    until = run.start + seconds
    tasks = [_hard_slot(r, run, until, 10 * i + s) for i, r in enumerate(replicas)
             for s in range(SLOTS)]  # fmt: skip
    if probe:
        tasks.append(_probe(replicas, run, until))
    await asyncio.gather(*tasks)
    return run


@dataclass
class Traffic:
    """Requests of one run: completions (seconds from start, user, tokens), chunks, errors."""

    done: list[tuple[float, str, int]] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    chunks: list[float] = field(default_factory=list)


@dataclass
class Contended:
    """The soft user behind in-quota users with ``outstanding`` requests each."""

    outstanding: int
    seconds: float
    traffic: Traffic
    band: list[float]  # band dispatches per replica during the run


@dataclass
class SoftRun:
    """The soft part: tokens/s alone round by round, and the contended runs."""

    rounds: dict[str, list[float]] = field(default_factory=dict)
    contended: list[Contended] = field(default_factory=list)

    @property
    def alone(self) -> dict[str, float]:
        """Mean tokens/s alone per user."""
        return {user: statistics.mean(v) for user, v in self.rounds.items()}


async def _loop(replica: Replica, user: str, t0: float, stop: float, out: Traffic) -> None:
    i = 0
    while time.monotonic() < stop:
        i += 1
        out.sent[user] = out.sent.get(user, 0) + 1
        try:
            _, tokens = await _one(replica, user, f"{user} {i}", out.chunks)
        except Exception as exc:  # counted: the soft band refuses nothing
            key = f"{user}: {type(exc).__name__}"
            out.errors[key] = out.errors.get(key, 0) + 1
            await asyncio.sleep(0.1)
            continue
        out.done.append((time.monotonic() - t0, user, tokens))


async def _users(replicas: Sequence[Replica], plan: dict[str, tuple[list[int], int]],
                 seconds: float, out: Traffic) -> float:  # fmt: skip
    """Each user keeps ``n`` requests going on each replica it names; return the start."""
    t0 = time.monotonic()
    loops = [(replicas[r], u) for u, (rs, n) in plan.items() for r in rs for _ in range(n)]
    await asyncio.gather(*(_loop(r, u, t0, t0 + seconds, out) for r, u in loops))
    return t0


async def _band(replica: Replica) -> float:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{replica.metrics_port}/metrics") as resp,
    ):
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("fairq_soft_band_dispatches_total")
    )


async def _soft(replicas: Sequence[Replica], alone_s: float, contended_s: float) -> SoftRun:
    res = SoftRun({IN_QUOTA[0]: [], SOFT: []})
    every = list(range(len(replicas)))
    await _users(replicas, {SOFT: ([0], 4)}, 3.0, Traffic())  # past SOFT_TPM through replica 0
    # The same load in quota and past it, in the order A B B A (drift cancels out).
    for user in (IN_QUOTA[0], SOFT, SOFT, IN_QUOTA[0]):
        got = Traffic()
        t0 = await _users(replicas, {user: (every, SOFT_OUTSTANDING)}, alone_s, got)
        # Tokens streamed per second past the first fifth (the ramp-up), not completions:
        # a round holds only a few of those per request slot.
        since = t0 + alone_s / 5
        streamed = sum(1 for t in got.chunks if since <= t < t0 + alone_s)
        res.rounds[user].append(streamed / (alone_s * 4 / 5))
        print(f"  soft: {user} alone {res.rounds[user][-1]:.0f} tokens/s, errors {got.errors}",
              flush=True)  # fmt: skip
    for outstanding in IN_OUTSTANDING:
        before = [await _band(r) for r in replicas]
        plan = {u: ([r], outstanding) for r, u in enumerate(IN_QUOTA)}
        traffic = Traffic()
        # sid's loops run past the in-quota users' end: its queued requests are then served.
        # Both start within a few ms of each other; times are from each one's own start.
        await asyncio.gather(
            _users(replicas, plan, contended_s, traffic),
            _users(replicas, {SOFT: (every, SOFT_OUTSTANDING)}, contended_s + 10.0, traffic),
        )
        band = [await _band(r) - b for r, b in zip(replicas, before, strict=True)]
        run = Contended(outstanding, contended_s, traffic, band)
        res.contended.append(run)
        print(f"  soft: behind {outstanding} each, share {soft_share(run):.3f}, band {band}, "
              f"errors {traffic.errors}", flush=True)  # fmt: skip
    return res


@contextlib.asynccontextmanager
async def _group(
    backend_url: str, redis_url: str | None, name: str
) -> AsyncIterator[list[Replica]]:
    """Start ``REPLICAS`` replicas (on Redis if ``redis_url``), each with an HTTP door."""
    from fairq_bench.cluster.setup import formed, replica_config  # imports the registry

    async with contextlib.AsyncExitStack() as stack:

        async def one(i: int) -> Replica:
            http_port, metrics_port = free_port(), free_port()
            text = replica_config(
                backend_url, f"{name}-{i}", redis_url, threshold=3,
                extra=f"{_extra()}\n[http]\nlisten = \"127.0.0.1:{http_port}\"",
            )  # fmt: skip
            text = f'metrics_listen = "127.0.0.1:{metrics_port}"\n{text}'
            _, target = await stack.enter_async_context(fairq_module_process(text))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
            return Replica(channel, http_port, metrics_port)

        replicas = list(await asyncio.gather(*(one(i) for i in range(REPLICAS))))
        if redis_url is not None:
            await formed(redis_url, REPLICAS)
        yield replicas


async def run_quota_cluster(
    minutes: float = MINUTES, soft_seconds: tuple[float, float] = (15.0, 30.0)
) -> tuple[list[ClusterRun], SoftRun]:
    """Both groups' hard-quota runs at once, then the soft part on the shared group.

    ``soft_seconds``: how long the soft user (and the in-quota one) send alone, and how long
    the in-quota users stay backlogged beside it.
    """
    seconds = 60.0 * minutes
    sim_cpus, other_cpus = split_cpus()
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(
            sim_process("--max-num-seqs", "16", "--speed", "1",
                        "--eos-mean-tokens", str(EOS_MEAN), cpus=sim_cpus)
        )  # fmt: skip
        stack.enter_context(confined(other_cpus))
        redis = stack.enter_context(RedisProcess.running())
        shared = await stack.enter_async_context(_group(url, redis.url, "shared"))
        alone = await stack.enter_async_context(_group(url, None, "alone"))
        print(f"  6 replicas up; {minutes:g} minutes of ann from all of them", flush=True)
        runs = list(
            await asyncio.gather(
                _hard("shared (Redis)", shared, seconds, probe=True),
                _hard("uncoordinated (three processes alone)", alone, seconds, probe=False),
            )
        )
        for run in runs:
            peaks = minute_peaks(run.granted, run.start, run.start + seconds)
            print(f"  {run.name}: {peaks['minutes']}, most {peaks['bucketed']} / "
                  f"{peaks['exact']}, refusals {len(run.refusals)}, errors {run.errors}",
                  flush=True)  # fmt: skip
        soft = await _soft(shared, *soft_seconds)
    return runs, soft


def soft_share(run: Contended) -> float:
    """sid's share of the tokens completed while the in-quota users were backlogged."""
    return share_of(run.traffic.done, SOFT, 0.0, run.seconds)
