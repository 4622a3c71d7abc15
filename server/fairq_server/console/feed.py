"""The live feed: the replicas' views read once per refresh, shared by every open page.

One task reads this replica's view (:func:`~fairq_server.observe.live.read_live`) every
``refresh_seconds``, publishes it to Redis in a cluster, and, while a page is open, reads the
other replicas' views back. Open pages wait for the next refresh and render from the same
views; the HTML of each view is rendered once per refresh however many pages show it. With
no page open and no cluster, a refresh reads nothing but the trends' sample when one is due
(every ``history_seconds``: a few metric families and the running requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from markupsafe import Markup

from fairq_server.console.render import fragment
from fairq_server.console.trends import trends_fragment, trends_off
from fairq_server.observe.history import LiveHistory
from fairq_server.observe.live import LiveView
from fairq_server.observe.replicas import ReplicaViews
from fairq_server.runtime.supervisor import stop_asked, stop_task

__all__ = ["LiveFeed"]

log = logging.getLogger(__name__)


class LiveFeed:
    """The views of the last refresh, and a way to wait for the next.

    Args:
        read: reads this replica's view now (on the event loop).
        every: seconds between refreshes (read again each time, so a reload applies).
        replicas: every replica's views through Redis (None outside a cluster).
        here: this replica's name (empty outside a cluster).
        history: the trends, sampled here every ``history_every()`` seconds (0: not).
        history_every: seconds between samples (read again each time, so a reload applies).

    """

    def __init__(
        self,
        read: Callable[[], LiveView],
        every: Callable[[], float],
        replicas: ReplicaViews | None = None,
        here: str = "",
        history: LiveHistory | None = None,
        history_every: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._read = read
        self._every = every
        self._history = history
        self._history_every = history_every
        self._sampled_at: float | None = None
        self._trends_html: tuple[int, Markup] = (-1, Markup())
        self._replicas = replicas
        self.here = here
        self.watchers = 0
        self.seq = 0
        self.views: list[dict[str, Any]] = []
        self._html: dict[str, Markup] = {}
        self._tick = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start refreshing."""
        self._task = asyncio.create_task(self._run(), name="console-feed")

    async def stop(self) -> None:
        """Stop refreshing."""
        await stop_task(self._task)

    async def current(self) -> list[dict[str, Any]]:
        """Return the views now (read afresh, for a page being loaded)."""
        return await self._views(everyone=True)

    @property
    def period(self) -> float:
        """Seconds between refreshes now."""
        return self._every()

    async def wait(self, after: int, timeout: float) -> int:
        """Wait for a refresh later than ``after``, at most ``timeout`` seconds.

        Returns:
            the last refresh's number: ``after`` itself when none came in time (a failing
            read publishes nothing, and an open stream must still check its credential).

        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), self._tick:
                await self._tick.wait_for(lambda: self.seq > after)
        return self.seq

    def html(self, view: str) -> Markup:
        """Return the last refresh's fragment of ``view`` (rendered once per refresh)."""
        if view == "trends":  # changes once per sample, not per refresh
            seq = self._history.seq if self._history is not None else 0
            if self._trends_html[0] != seq:
                self._trends_html = (seq, self._trends())
            return self._trends_html[1]
        cached = self._html.get(view)
        if cached is None:
            cached = self._html[view] = fragment(view, self.views, self.here)
        return cached

    def _trends(self) -> Markup:
        if self._history is None or self._history_every() <= 0:
            return trends_off()
        return trends_fragment(self._history.trends(), self._history.times, self.here)

    def _sample(self) -> None:
        """Sample the trends if one is due (whether a page is open or not)."""
        every = self._history_every()
        if self._history is None or every <= 0:
            return
        now = time.monotonic()
        if self._sampled_at is None or now - self._sampled_at >= every:
            self._sampled_at = now
            self._history.sample()

    async def _views(self, *, everyone: bool = False) -> list[dict[str, Any]]:
        """Return this replica's view (published), and the others' if a page is open."""
        mine = self._read().to_json()
        if self._replicas is None:
            return [mine]
        await self._replicas.publish(mine)
        if not (self.watchers or everyone):
            return [mine]
        others = [v for v in await self._replicas.read() if v.get("replica") != self.here]
        return sorted(
            [mine, *others], key=lambda v: (v.get("replica") != self.here, str(v.get("replica")))
        )

    async def _run(self) -> None:
        while not stop_asked():
            try:
                self._sample()
                if self.watchers or self._replicas is not None:
                    views = await self._views()
                    async with self._tick:
                        self.views, self._html = views, {}
                        self.seq += 1
                        self._tick.notify_all()
            except Exception:  # a bug here must not end the console's refreshes
                log.exception("console: reading the live view failed")
            await asyncio.sleep(self._every())  # the refresh cadence, not a synchronisation
