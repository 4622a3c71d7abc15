"""Running a mix: closed-loop callers against the engine directly or through fairq.

Each caller keeps its ``in_flight`` requests outstanding (one task per request slot, each
sending the next request as soon as its last one ends) from its ``start`` until the run ends.
Every completed request is kept with its first-token and end times; its tokens are counted as
produced evenly between the two, so shares over any window (:meth:`Run.tokens`) are exact to
within one request's spread.

fairq runs in one of these modes (:data:`MODES`), each a fresh process (or set of replicas):

* ``fairq, engine queue``: the configuration as a new user writes it (no ``max_in_flight``):
  fairq keeps the engine's waiting queue at the tier's threshold and the engine orders it;
* ``fairq``: the backend's slots given (``max_in_flight``), so fairq decides at the slot;
* ``fairq + preemption``: the same with preemption (``preempt_after_seconds = 0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from fairq_bench.closed_loop.mixes import Caller, Mix
from fairq_bench.cluster.setup import formed
from fairq_bench.processes import fairq_module_process
from fairq_bench.redis_process import RedisProcess
from fairq_bench.scenarios.common import api_key
from fairq_bench.targets import direct_sender, http_client, keyed_sender
from fairq_bench.workload import RequestSpec, SendFn
from fairq_server.identity.auth import hash_key

__all__ = ["DIRECT", "MODES", "Done", "Engine", "Run", "fairq_config", "run_mix"]

DIRECT = "direct"
ENGINE_QUEUE = "fairq, engine queue"
SLOTS = "fairq"
PREEMPT = "fairq + preemption"
MODES = (ENGINE_QUEUE, SLOTS, PREEMPT)


@dataclass(frozen=True)
class Engine:
    """The engine under test: where it listens, its kind, model and slots."""

    url: str
    kind: str  # vllm, tgi, llamacpp
    model: str
    slots: int

    def backend_toml(self) -> str:
        """The ``[[backends]]`` lines naming it (without caps)."""
        kind = self.kind
        if kind == "llamacpp":
            kind = 'openai"\nmetrics_preset = "llamacpp'
        return (
            "[[backends]]\n"
            'id = "engine"\n'
            f'kind = "{kind}"\n'
            f'base_url = "{self.url}"\n'
            f'models = ["{self.model}"]\n'
        )


@dataclass(frozen=True)
class Done:
    """One completed request: its caller, when it was sent, first token and end, tokens."""

    caller: str
    sent: float
    first: float
    end: float
    tokens: int


@dataclass
class Run:
    """The completed requests of one mix in one mode (times from the run's start)."""

    mix: Mix
    mode: str
    seconds: float
    replicas: int = 1
    done: list[Done] = field(default_factory=list)
    errors: int = 0

    def tokens(self, since: float = 0.0, until: float | None = None) -> dict[str, float]:
        """Tokens per caller produced within ``[since, until)``, spread over each request."""
        until = self.seconds if until is None else until
        out = {c.name: 0.0 for c in self.mix.callers}
        for d in self.done:
            lo, hi = max(d.first, since), min(d.end, until)
            if hi <= lo:
                continue
            span = d.end - d.first
            out[d.caller] += d.tokens * ((hi - lo) / span if span > 0 else 1.0)
        return out

    def shares(self, since: float = 0.0, until: float | None = None) -> dict[str, float]:
        """Each caller's share of the tokens within the window."""
        tokens = self.tokens(since, until)
        total = sum(tokens.values()) or 1.0
        return {name: v / total for name, v in tokens.items()}

    def throughput(self, since: float, until: float | None = None) -> float:
        """Tokens per second within the window."""
        until = self.seconds if until is None else until
        return sum(self.tokens(since, until).values()) / max(until - since, 1e-9)


def fairq_config(
    engine: Engine, mix: Mix, mode: str, *, redis_url: str | None = None, replica: int = 0
) -> str:
    """The configuration of a fairq process (replica ``replica`` with ``redis_url``)."""
    lines = [
        'listen = "127.0.0.1:0"',
        "[scheduler]",
        'fairness = "vtc"',
        "poll_interval_seconds = 0.1",
        "[[tiers]]",
        'name = "standard"',
        "max_backend_waiting = 3",
        # With the slots capped nothing waits in the engine; a TPOT hold would idle slots
        # (docs/benchmarks/preemption.md): off, as docs/operations.md advises with a cap.
        f"tpot_limit_seconds = {1000.0 if mode != ENGINE_QUEUE else 0.15}",
    ]
    if mode == PREEMPT:
        lines.append("preempt_after_seconds = 0.0")
    for team, weight in mix.teams.items():
        lines += ["[[teams]]", f'name = "{team}"', f"weight = {weight:g}"]
    for c in mix.callers:
        lines += ["[[keys]]", f'user = "{c.name}"', f'sha256 = "{hash_key(api_key(c.name))}"']
        lines.append(f"weight = {c.weight:g}")
        if c.team:
            lines.append(f'team = "{c.team}"')
    text = "\n".join(lines) + "\n" + engine.backend_toml()
    if mode != ENGINE_QUEUE:
        text += f"max_in_flight = {engine.slots}\n"
    if mode == PREEMPT:
        text += "preempt = true\n"
    if redis_url is not None:
        text += (
            "[cluster]\n"
            f'redis_url = "{redis_url}"\n'
            f'replica_id = "replica-{replica}"\n'
            "lease_seconds = 5.0\n"
        )
    return text


async def _caller(send: SendFn, c: Caller, start: float, until: float, run: Run, slot: int) -> None:
    delay = start + c.start - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)  # the caller's arrival, not a synchronisation
    i = 0
    while time.monotonic() < until:
        spec = RequestSpec(c.name, f"{c.name} {slot} request {i}: tell me a story", c.tokens)
        i += 1
        sent = time.monotonic()
        first: float | None = None
        try:
            async for text in send(spec):
                if first is None and text:
                    first = time.monotonic()
        except Exception:
            run.errors += 1
            await asyncio.sleep(0.05)  # an error's retry pace, not a synchronisation
            continue
        end = time.monotonic()
        run.done.append(Done(c.name, sent - start, (first or end) - start, end - start, c.tokens))


async def drive(senders: Sequence[SendFn], mix: Mix, mode: str, seconds: float) -> Run:
    """Run ``mix`` for ``seconds``: caller ``i`` sends through ``senders[i % len]``."""
    run = Run(mix, mode, seconds, replicas=len(senders))
    start = time.monotonic()
    until = start + seconds
    await asyncio.gather(
        *(
            _caller(senders[i % len(senders)], c, start, until, run, slot)
            for i, c in enumerate(mix.callers)
            for slot in range(c.in_flight)
        )
    )
    return run


@contextlib.asynccontextmanager
async def _fairq(
    engine: Engine, mix: Mix, mode: str, replicas: int, redis: RedisProcess | None
) -> AsyncIterator[list[SendFn]]:
    keys = {c.name: api_key(c.name) for c in mix.callers}
    async with contextlib.AsyncExitStack() as stack:
        redis_url = redis.url if redis is not None else None
        senders = []
        for i in range(replicas):
            text = fairq_config(engine, mix, mode, redis_url=redis_url, replica=i)
            _, target = await stack.enter_async_context(fairq_module_process(text))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
            senders.append(keyed_sender(channel, engine.model, keys))
        if redis_url is not None:
            await formed(redis_url, replicas)
        yield senders


async def run_mix(
    engine: Engine,
    mix: Mix,
    mode: str,
    seconds: float,
    *,
    replicas: int = 1,
    redis: RedisProcess | None = None,
) -> Run:
    """Run ``mix`` in ``mode`` (``direct`` or one of :data:`MODES`) for ``seconds``."""
    if mode == DIRECT:
        async with http_client() as client:
            kind = "tgi" if engine.kind == "tgi" else "vllm"
            send = direct_sender(client, engine.url, engine.model, kind)
            return await drive([send], mix, mode, seconds)
    async with _fairq(engine, mix, mode, replicas, redis) as senders:
        return await drive(senders, mix, mode, seconds)
