"""Scrapes a backend's ``/metrics`` on an interval and publishes gate snapshots."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fairq_server.backends.base import Backend, MetricsSample
from fairq_server.errors import BackendError
from fairq_server.scheduling.gate import BackendLoad, MetricsSnapshot

__all__ = ["MetricsPoller"]

log = logging.getLogger(__name__)


class MetricsPoller:
    """Keeps ``load.snapshot`` of one backend fresh.

    Time per output token is measured over the last window as the difference of two
    cumulative histogram scrapes, so one slow request long ago does not hold the gate shut.
    A failed scrape leaves the old snapshot in place to go stale: the gate then fails closed.

    A backend that has answered before is marked unhealthy only after
    ``unhealthy_after_failures`` consecutive failed scrapes: one scrape that times out while
    the event loop stalls for a moment must not take a working backend out of dispatch and
    retry routing. One that has never answered is unhealthy from its first failure.
    """

    def __init__(
        self,
        backend: Backend,
        load: BackendLoad,
        *,
        interval: float,
        on_update: Callable[[MetricsPoller], None] = lambda poller: None,
        unhealthy_after_failures: int = 2,
    ) -> None:
        self.backend = backend
        self.load = load
        self.interval = interval
        self.unhealthy_after_failures = unhealthy_after_failures
        self.healthy: bool | None = None  # None until the first scrape answered
        self.last_error = ""
        self.scrapes = 0
        self.failures = 0
        self.consecutive_failures = 0  # > 0 exactly when the last scrape failed
        self._on_update = on_update
        self._previous: MetricsSample | None = None
        self._last_tpot: float | None = None

    async def poll_once(self) -> None:
        """Scrape once and publish the snapshot (or record the failure)."""
        started = time.monotonic()
        awaiting = self.load.awaiting_first_token
        try:
            sample = await self.backend.scrape(timeout=max(self.interval * 5, 1.0))
        except BackendError as exc:
            self.failures += 1
            self.consecutive_failures += 1
            self.last_error = str(exc)
            if self.healthy is not False:
                n, limit = self.consecutive_failures, self.unhealthy_after_failures
                if self.healthy is None or n >= limit:
                    log.warning(
                        "backend %s unhealthy after %d failed scrape(s): %s",
                        self.backend.id,
                        n,
                        exc,
                    )
                    self.healthy = False
                    self.load.healthy = False
                else:
                    log.warning(
                        "backend %s: scrape failed (%d of %d before it counts as unhealthy): %s",
                        self.backend.id,
                        n,
                        limit,
                        exc,
                    )
            self._on_update(self)
            return
        self.scrapes += 1
        self.consecutive_failures = 0
        if self.healthy is False:
            log.info("backend %s healthy again", self.backend.id)
        self.healthy = True
        self.load.healthy = True
        self.last_error = ""
        self.load.snapshot = MetricsSnapshot(
            taken_at=started,
            waiting=sample.waiting,
            running=sample.running,
            kv_usage=sample.kv_usage,
            tpot_seconds=self._window_tpot(sample),
            awaiting_mark=awaiting,
        )
        self._on_update(self)

    def _window_tpot(self, sample: MetricsSample) -> float | None:
        prev, self._previous = self._previous, sample
        if prev is None:
            return None
        count = sample.tpot_count - prev.tpot_count
        if count < 0:  # the backend restarted and its counters began again
            return None
        if count == 0:
            # No request finished in this window: keep the last measurement while work is
            # running, so a saturated backend does not look fast just between completions.
            return self._last_tpot if sample.running else None
        self._last_tpot = (sample.tpot_sum - prev.tpot_sum) / count
        return self._last_tpot

    async def run(self) -> None:
        """Poll forever, every ``interval`` seconds from the start of the previous scrape."""
        while True:
            started = time.monotonic()
            await self.poll_once()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
