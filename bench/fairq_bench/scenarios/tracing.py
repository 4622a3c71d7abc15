"""Open-loop replay that records when each piece of text arrived, and can stop on time.

:func:`fairq_bench.workload.replay` waits for every request to finish. Under sustained
overload that never ends well (the backlog grows for as long as the run lasts), and fairness
is about *when* service was given, not only whether. :func:`trace_replay` records a
``(time, characters so far)`` point per chunk and cancels whatever is still open at
``stop_at``; the service accounting in :mod:`.service` turns the points into tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fairq_bench.workload import RequestSpec, SendFn

__all__ = ["Trace", "scaled", "trace_replay"]


@dataclass
class Trace:
    """What happened to one request; times are seconds from the start of the run.

    Attributes:
        spec: the request.
        sent: when it was sent.
        first: when its first text arrived (None: never).
        done: when its stream ended (None: still open when the run stopped).
        points: ``(time, characters received so far)`` after each chunk.
        error: the exception text if the stream failed.

    """

    spec: RequestSpec
    sent: float = 0.0
    first: float | None = None
    done: float | None = None
    points: list[tuple[float, int]] = field(default_factory=list)
    error: str = ""

    @property
    def finished(self) -> bool:
        """True if the stream ended normally."""
        return self.done is not None and not self.error

    @property
    def chars(self) -> int:
        """Characters received."""
        return self.points[-1][1] if self.points else 0

    def ttft(self, end: float) -> float:
        """Time to first text; a request without any counts until ``end`` (a lower bound)."""
        return (self.first if self.first is not None else end) - self.sent


def scaled(specs: Sequence[RequestSpec], speed: float) -> list[RequestSpec]:
    """Divide every send time by ``speed`` (simulated seconds to wall seconds)."""
    return [
        RequestSpec(s.user, s.prompt, s.max_tokens, at=s.at / speed, tier=s.tier) for s in specs
    ]


async def _one(spec: RequestSpec, send: SendFn, start: float, trace: Trace) -> None:
    delay = start + spec.at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)  # open loop: the schedule sets the pace
    trace.sent = time.monotonic() - start
    chars = 0
    try:
        async for text in send(spec):
            if not text:
                continue
            now = time.monotonic() - start
            if trace.first is None:
                trace.first = now
            chars += len(text)
            trace.points.append((now, chars))
    except Exception as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    trace.done = time.monotonic() - start


async def trace_replay(
    specs: Sequence[RequestSpec],
    send: SendFn,
    *,
    stop_at: float | None = None,
    on_done: Callable[[Trace], None] | None = None,
) -> list[Trace]:
    """Send every request at its time; return traces in the order of ``specs``.

    Args:
        specs: the schedule (``at`` in wall seconds from the start).
        send: the target.
        stop_at: cancel every request still open at this time (None: wait for all).
        on_done: called as each request ends.

    """
    start = time.monotonic()
    traces = [Trace(s) for s in specs]

    async def run(spec: RequestSpec, trace: Trace) -> None:
        await _one(spec, send, start, trace)
        if on_done is not None:
            on_done(trace)

    tasks = [asyncio.create_task(run(s, t)) for s, t in zip(specs, traces, strict=True)]
    try:
        if stop_at is None:
            await asyncio.gather(*tasks)
        else:
            remaining = start + stop_at - time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(remaining, 0.0)):
                    await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        # Cancelled streams close their connections; the run's processes are stopped next.
        await asyncio.gather(*tasks, return_exceptions=True)
    return traces
