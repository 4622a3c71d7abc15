"""Forwarding in a cluster: reserve a slot in the shared gate, then read the backend stream.

The dispatcher loop never waits on Redis. Its gate admits on the local view (this replica's
requests plus the other replicas' as last read); the launcher then reserves the slot in
Redis in a task of its own and only then opens the backend request. If Redis refuses
(another replica took the slot since the last read), the request goes back among its user's
queued requests (:class:`~fairq_server.scheduling.events.Refused`) with the fresh counts
(:class:`~fairq_server.scheduling.events.PeerView`), which close the local gate until a
slot frees. A reservation that fails because Redis is unreachable is not forwarded either:
it was admitted against the shared view, and goes back to be admitted again on the local
share (with every replica's in-flight reservations forwarded at once, the backend's queue
would grow by up to the threshold per replica). The cost is one Redis round trip before the
backend request leaves.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fairq_server.backends.request import StreamEnd, TextDelta
from fairq_server.backends.stream_reader import start_reading
from fairq_server.config import TierConfig
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.attempts import AttemptSink, StreamLauncher
from fairq_server.scheduling.ticket import AttemptHandle, Ticket

if TYPE_CHECKING:
    from fairq_server.cluster.node import ClusterNode

__all__ = ["ClusterLauncher"]

log = logging.getLogger(__name__)


class _FirstTokenSink(AttemptSink):
    """An attempt sink that also tells the shared gate when the first token arrives."""

    def __init__(
        self, post: Callable[[ev.Event], None], ticket: Ticket, on_first: Callable[[], None]
    ) -> None:
        super().__init__(post, ticket)
        self._on_first: Callable[[], None] | None = on_first

    def text(self, delta: TextDelta) -> bool:
        if self._on_first is not None:
            on_first, self._on_first = self._on_first, None
            on_first()
        return super().text(delta)

    def ended(self, end: StreamEnd) -> None:
        self._on_first = None
        super().ended(end)


class ClusterLauncher(StreamLauncher):
    """Reserves each attempt's slot in the shared gate before reading its backend stream.

    Args:
        post: the dispatcher's inbox.
        window: read pacing (see :class:`StreamLauncher`).
        node: this replica's cluster membership.
        tiers: the dispatcher's current tiers (the thresholds to reserve against).

    """

    def __init__(
        self,
        post: Callable[[ev.Event], None],
        window: float,
        node: ClusterNode,
        tiers: Callable[[], Sequence[TierConfig]],
    ) -> None:
        super().__init__(post, window)
        self._node = node
        self._tiers = tiers
        self._seq = itertools.count()

    def __call__(self, ticket: Ticket) -> AttemptHandle:
        """Start ``ticket``'s attempt: reserve, then read (a task; cancel it to abort)."""
        backend = ticket.backend
        assert backend is not None
        tier = self._tiers()[ticket.tier]
        sample = backend.sample
        # Other clients' waiting requests as of the last scrape (fairq's share removed).
        others = max(0.0, sample.waiting - backend.awaiting_mark) if sample is not None else 0.0
        threshold = max(tier.max_backend_waiting, 1)
        member = f"{self._node.replica_id}|{next(self._seq)}"
        self._node.dispatched()
        return asyncio.create_task(
            self._run(ticket, ticket.attempt, backend.id, member, others, threshold,
                      backend.max_in_flight)
        )  # fmt: skip

    async def _run(
        self, ticket: Ticket, attempt: int, backend_id: str, member: str, others: float,
        threshold: int, cap: int,
    ) -> None:  # fmt: skip
        node = self._node
        held = False
        try:
            if node.reserving:
                started = time.perf_counter()
                granted = await node.reserve(backend_id, member, others, threshold, cap)
                node.metrics.reserve_seconds.observe(time.perf_counter() - started)
                if not granted:
                    # Refused, or Redis just lost (None): the request was admitted against
                    # the shared view, so it queues again and the gate decides afresh (on
                    # the local share, if Redis is gone).
                    self._post(ev.Refused(ticket, attempt))
                    return
            else:  # Redis unreachable: forwarded on the local share
                node.metrics.reservations.labels(backend_id, "local").inc()
                node.hold_local(backend_id, member)
            held = True
            if ticket.attempt != attempt:
                return  # aborted while reserving
            assert ticket.backend is not None
            sink = _FirstTokenSink(self._post, ticket, lambda: node.first_token(backend_id, member))
            stream = ticket.backend.backend.stream(ticket.request, ticket.priority)
            # Awaiting the reader: cancelling this task (an abort) cancels the reader too.
            await start_reading(stream, sink, self.window)
        finally:
            if held:
                node.release(backend_id, member)
