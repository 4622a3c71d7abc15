"""The load's client side: one request sent to fairq, its events read to the end, and the
tally of what many requests saw (final statuses and breaches of the terminal-event contract)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import grpc

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.load.sizes import MODEL

__all__ = ["Outcome", "Spec", "Tally", "channels", "prompt_for", "send"]


@dataclass(frozen=True)
class Spec:
    """One request of the load.

    Attributes:
        user: fairness identity (``x-fairq-user``).
        max_tokens: exact output length (``ignore_eos``).
        cancel_after: the client cancels after this many chunks (None: reads to the end).
        timeout: gRPC deadline in seconds (None: none).

    """

    user: str
    max_tokens: int
    cancel_after: int | None = None
    timeout: float | None = None


@dataclass
class Outcome:
    """What one request saw, in order; ``code`` is its final status name.

    ``CLIENT_CANCELLED`` means the client itself left the stream (not a server answer).
    """

    code: str = "OK"
    details: str = ""
    events: int = 0
    queued: int = 0
    started: int = 0
    chunks: int = 0
    finished: int = 0
    after_finished: int = 0
    first: str = ""

    @property
    def terminal_ok(self) -> bool:
        """Exactly one terminal event: a ``finished`` and a clean end, or an error status."""
        if self.code == "OK":
            return self.finished == 1 and self.after_finished == 0
        return self.finished == 0 or self.deadline_race

    @property
    def deadline_race(self) -> bool:
        """``finished`` came, then the call's own deadline struck before the OK status did.

        gRPC sends the last message and the status separately, and the client's deadline
        timer may fire between them: the client reports DEADLINE_EXCEEDED although the
        request completed. Counted apart, not as a violation of fairq's contract.
        """
        return self.code == "DEADLINE_EXCEEDED" and self.finished == 1 and not self.after_finished


class Tally:
    """Outcomes of many requests; counts of each final status and of contract violations."""

    def __init__(self) -> None:
        self.codes: Counter[str] = Counter()
        self.violations: list[Outcome] = []
        self.repeated_started = 0
        self.deadline_races = 0  # see Outcome.deadline_race
        self.unavailable: Counter[str] = Counter()
        self.examples: dict[str, str] = {}  # the first message seen for each error status
        self.reached_server = 0
        self.progress: Counter[str] = Counter()
        self._changed = asyncio.Condition()

    def add(self, outcome: Outcome) -> None:
        """Record a finished request."""
        self.codes[outcome.code] += 1
        if outcome.code not in ("OK", "CLIENT_CANCELLED") and outcome.code not in self.examples:
            self.examples[outcome.code] = outcome.details
        self.repeated_started += outcome.started > 1
        # When UNAVAILABLE struck. Dispatched but failed before any text is what the design
        # retries on another backend, so with a healthy one available it should be rare.
        if outcome.code == "UNAVAILABLE":
            when = (
                "mid-stream" if outcome.chunks else "before text" if outcome.started else "queued"
            )
            self.unavailable[when] += 1
        # Surely seen by fairq's servicer (a deadline or our own cancel may beat it there).
        self.reached_server += bool(outcome.events) or outcome.code not in (
            "DEADLINE_EXCEEDED",
            "CLIENT_CANCELLED",
            "CANCELLED",
        )
        self.deadline_races += outcome.deadline_race
        if not outcome.terminal_ok or (outcome.events and outcome.first != "queued"):
            self.violations.append(outcome)

    async def note(self, what: str) -> None:
        """Count a progress event (``queued``, ``started``, ``streaming``: the first chunk)
        and wake :meth:`wait_for`."""
        self.progress[what] += 1
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, what: str, count: int, timeout: float) -> None:
        """Wait until ``count`` progress events ``what`` were seen.

        Raises:
            TimeoutError: not within ``timeout`` seconds.

        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.progress[what] >= count)


async def send(
    channel: grpc.aio.Channel,
    spec: Spec,
    tally: Tally,
    prompt: str,
    admission: asyncio.Semaphore | None = None,
) -> Outcome:
    """Run one request to its end (or the client's cancel) and record it in ``tally``.

    With ``admission``, the call holds one of its permits from before it is sent until fairq
    answers its first event: this bounds the calls fairq has not yet accepted (see
    :data:`ADMISSION_WINDOW`).
    """
    request = scheduler_pb2.GenerateRequest(
        model=MODEL,
        prompt=prompt,
        sampling=scheduler_pb2.SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
    )
    out = Outcome()
    holding = admission is not None
    if admission is not None:
        await admission.acquire()
    call = scheduler_pb2_grpc.SchedulerStub(channel).Generate(
        request, metadata=(("x-fairq-user", spec.user),), timeout=spec.timeout
    )
    try:
        while (response := await call.read()) is not grpc.aio.EOF:
            assert isinstance(response, scheduler_pb2.GenerateResponse)
            if not out.events:
                await tally.note("answered")
            if holding and admission is not None:
                admission.release()
                holding = False
            kind = response.WhichOneof("event") or ""
            out.events += 1
            out.first = out.first or kind
            if out.finished:
                out.after_finished += 1
            if kind == "queued":
                out.queued += 1
                await tally.note("queued")
            elif kind == "started":
                out.started += 1
                await tally.note("started")
            elif kind == "chunk":
                out.chunks += 1
                if out.chunks == 1:
                    await tally.note("streaming")
                if spec.cancel_after is not None and out.chunks >= spec.cancel_after:
                    call.cancel()
                    out.code = "CLIENT_CANCELLED"
                    break
            elif kind == "finished":
                out.finished += 1
    except grpc.aio.AioRpcError as exc:
        out.code, out.details = exc.code().name, exc.details() or ""
    except asyncio.CancelledError:
        call.cancel()
        raise
    finally:
        if holding and admission is not None:
            admission.release()
    tally.add(out)
    if not out.events:
        await tally.note("answered")
    await tally.note("ended")
    return out


def channels(target: str, count: int) -> list[grpc.aio.Channel]:
    """``count`` channels to ``target``, each with its own TCP connection."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    return [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]


def prompt_for(user: str, n: int) -> str:
    """A short prompt, distinct per request (no accidental prefix sharing across users)."""
    return f"{user} asks question {n}: what is fair queueing?"
