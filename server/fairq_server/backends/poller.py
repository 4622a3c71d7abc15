"""Scrapes a backend's ``/metrics`` on an interval and reports what each scrape found.

The poller decides nothing: each scrape's outcome, a :class:`MetricsSample` or the
:class:`BackendError` it failed with, goes to ``on_result``; health, staleness and the gate's
reading of the sample belong to whoever consumes it. ``on_sent`` marks the moment a scrape
leaves, so the consumer can tell which of its own requests the answer can already show.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fairq_server.backends.base import Backend
from fairq_server.backends.request import MetricsSample
from fairq_server.errors import BackendError
from fairq_server.runtime.supervisor import stop_asked

__all__ = ["MetricsPoller", "ScrapeResult"]

ScrapeResult = MetricsSample | BackendError


class MetricsPoller:
    """Scrapes one backend every ``interval`` seconds (from the start of the previous scrape).

    A backend whose scrapes fail is scraped ever less often: the wait doubles with each
    consecutive failure, up to ``max_backoff`` seconds, and the first success restores
    ``interval``. A dead backend then costs a scrape every ``max_backoff`` seconds instead of
    every ``interval``, so many of them do not crowd out the scrapes and work of live ones.

    Args:
        backend: the backend to scrape.
        interval: seconds between scrapes; may be changed while running (applies from the
            next scrape).
        max_backoff: the longest wait between the scrapes of a failing backend (never below
            ``interval``); may be changed while running.
        on_sent: called with the backend id as a scrape is sent.
        on_result: called with the backend id and the outcome of each scrape.
        timeout: seconds a scrape may take (None: five intervals, at least 1 s); may be
            changed while running.

    """

    def __init__(
        self,
        backend: Backend,
        *,
        interval: float,
        max_backoff: float = 10.0,
        on_sent: Callable[[str], None],
        on_result: Callable[[str, ScrapeResult], None],
        timeout: float | None = None,
    ) -> None:
        self.backend = backend
        self.interval = interval
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.consecutive_failures = 0
        self._on_sent = on_sent
        self._on_result = on_result

    async def poll_once(self) -> ScrapeResult:
        """Scrape once, report the outcome and return it."""
        self._on_sent(self.backend.id)
        result: ScrapeResult
        try:
            timeout = self.timeout or max(self.interval * 5, 1.0)
            result = await self.backend.scrape(timeout=timeout)
        except BackendError as exc:
            result = exc
        self.consecutive_failures = (
            self.consecutive_failures + 1 if isinstance(result, BackendError) else 0
        )
        self._on_result(self.backend.id, result)
        return result

    def next_wait(self) -> float:
        """Seconds from the start of the last scrape to the next (backed off after failures)."""
        if not self.consecutive_failures:
            return self.interval
        backed_off = self.interval * (1 << min(self.consecutive_failures, 30))
        return max(self.interval, min(self.max_backoff, backed_off))

    async def run(self) -> None:
        """Poll until cancelled."""
        while not stop_asked():
            started = time.monotonic()
            await self.poll_once()
            await asyncio.sleep(max(0.0, self.next_wait() - (time.monotonic() - started)))
