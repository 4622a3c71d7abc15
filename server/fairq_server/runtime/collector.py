"""Cyclic garbage collection paced for a server that must not stall.

CPython 3.11 collects its oldest generation in one stop-the-world pass over every tracked
object, and fairq's heap is mostly request state: a queued request holds about a hundred
tracked objects (its gRPC call, coroutines, futures, ticket). With 2,000 streams running and
4,000 requests queued a full pass took 300-420 ms (~60 us per request held), and the
interpreter started one every few seconds (it does whenever a quarter of the heap was
promoted since the last one, and request state is promoted as it ages). Those passes found
next to nothing: 283 objects in eleven passes that stalled the event loop for 2.7 s in all.
Request state is freed by reference counting, and short-lived cycles by the cheap
young-generation passes. What does need a full pass is small and old: chiefly asyncio's
transports, each in a cycle with its own bound method, so every closed backend connection
(a cancelled stream aborts its connection) stays until a full pass, about six objects each.

So the :class:`Collector` freezes what exists at start-up (code, configuration, the server
itself: never scanned again), leaves the young generations to the interpreter, and runs the
full pass itself when it is cheap: when at most ``quiet_requests`` requests are held (a pass
then takes tens of milliseconds at most), no more often than every ``min_interval``; and, as a
safety valve for a process that never gets that quiet, once ``max_interval`` has passed. Every
pass, young or old, is reported to ``observe`` with its duration.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fairq_server.runtime.clock import SYSTEM_CLOCK, Clock
from fairq_server.runtime.supervisor import stop_task

__all__ = ["Collector"]

# The interpreter collects the oldest generation after this many young collections (and only
# if a quarter of the heap is new there): never, in practice.
_NEVER = 2**31 - 1
# Collectors started and not yet stopped in this process: the interpreter's settings are
# process-wide, so the first start changes them and the last stop restores them.
_active: list[Collector] = []
_saved_threshold: tuple[int, int, int] = gc.get_threshold()


class Collector:
    """Runs the oldest-generation collection at quiet moments; reports every pass.

    Args:
        live_requests: how many requests are queued or running right now.
        observe: called on the event loop with (generation, seconds) for every pass.
        check_interval: how often to look for a quiet moment.
        quiet_requests: at most this many requests held counts as quiet.
        min_interval: the shortest time between two full passes at quiet moments.
        max_interval: the longest time between two full passes, quiet or not.
        clock: what the intervals are measured and waited on (a pass's own duration is
            always the real time it held the interpreter).

    """

    def __init__(
        self,
        live_requests: Callable[[], int],
        observe: Callable[[int, float], None],
        *,
        check_interval: float = 1.0,
        quiet_requests: int = 500,
        min_interval: float = 10.0,
        max_interval: float = 600.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._live_requests = live_requests
        self._observe = observe
        self._check_interval = check_interval
        self._quiet_requests = quiet_requests
        self._min_interval = min_interval
        self._max_interval = max_interval
        # Passes may run in any thread (the metrics server's too); the loop reports them.
        self._passes: deque[tuple[int, float]] = deque()
        self._started_at = 0.0
        self._last_full = self._clock.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Freeze the start-up heap, take over the oldest generation, start the checks."""
        global _saved_threshold
        gc.callbacks.append(self._on_pass)
        if not _active:
            _saved_threshold = gc.get_threshold()
            young, middle, _ = _saved_threshold
            gc.collect()
            gc.freeze()
            gc.set_threshold(young, middle, _NEVER)
        _active.append(self)
        self._last_full = self._clock.monotonic()
        self._task = asyncio.create_task(self._run(), name="collector")

    async def stop(self) -> None:
        """Stop; the last collector stopped gives the interpreter its own settings back."""
        if self._task is None:
            return
        await stop_task(self._task)
        self._task = None
        gc.callbacks.remove(self._on_pass)
        _active.remove(self)
        if not _active:
            gc.set_threshold(*_saved_threshold)
            gc.unfreeze()

    def collect_if_due(self) -> bool:
        """Run a full pass if fairq is quiet enough or the last one is too old; True if ran."""
        self._report()
        # The middle generation's count is 0 right after a full pass and grows with every
        # middle pass, i.e. only when objects were promoted to the oldest generation since.
        if gc.get_count()[2] == 0:
            return False
        since = self._clock.monotonic() - self._last_full
        quiet = self._live_requests() <= self._quiet_requests and since >= self._min_interval
        if not quiet and since < self._max_interval:
            return False
        gc.collect()
        self._last_full = self._clock.monotonic()
        self._report()
        return True

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self._check_interval)
            self.collect_if_due()

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
        else:
            self._passes.append((int(info["generation"]), time.perf_counter() - self._started_at))

    def _report(self) -> None:
        while self._passes:
            self._observe(*self._passes.popleft())
