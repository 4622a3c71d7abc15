"""Forwarding in a cluster: reserve a slot in the shared gate, then read the backend stream.

The dispatcher loop never waits on Redis. Its gate admits on the local view (this replica's
requests plus the other replicas' as last read); the launcher then reserves the slot in
Redis in a task of its own and only then opens the backend request. The reservation asks the
configured :class:`~fairq_server.scheduling.interfaces.Gate` plugin, not a copy of its rule:
Redis puts the request's member in the shared sets and returns the counts it found there (one
atomic script, so every reservation sees exactly those before it), and the gate checks the
backend as those counts show it, the other replicas' requests counted as in the local gate.
If it refuses (another replica took the slot since the last read), the member is withdrawn
and the request goes back among its user's queued requests
(:class:`~fairq_server.scheduling.events.Refused`) with the fresh counts
(:class:`~fairq_server.scheduling.events.PeerView`), which close the local gate until a
slot frees. A member withdrawn a moment later only ever makes a concurrent reservation more
cautious, never less. A reservation that fails because Redis is unreachable is not forwarded either:
it was admitted against the shared view, and goes back to be admitted again on the local
share (with every replica's in-flight reservations forwarded at once, the backend's queue
would grow by up to the threshold per replica). The cost is one Redis round trip before the
backend request leaves, unless the replica holds an idle slot of its credit (:mod:`.credit`):
then the request takes that slot's member and leaves at once, if the gate admits it on the
local view (as the dispatcher just checked; a request sent past a full queue on a boost
reserves as before), and not with a quota reservation to ride along (which needs the trip).

A preemption hands the victim's slot to the request it starts (:meth:`ClusterLauncher.hand_over`):
the victim's member is not released, and the new attempt takes it over in Redis (one script;
the member never leaves the shared count), past the gate, so no other replica's request can
take the slot in between. Only if its lease ran out meanwhile does it reserve anew.

A slot held for a caller's next request (:mod:`fairq_server.scheduling.anticipation`) is
handed over the same way: when an attempt ends and the dispatcher says its slot may be held
(:attr:`may_hold`), its member is kept (parked) instead of released, so the other replicas see
the slot taken; the user's next request takes it over, or the member is released when the
dispatcher decides against the hold or it lapses (:meth:`ClusterLauncher.let_go`), and at the
latest after ``anticipation_seconds`` and a margin.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fairq_server.backends.request import StreamEnd, TextDelta
from fairq_server.backends.stream_reader import start_reading
from fairq_server.cluster.credit import Credit
from fairq_server.cluster.quota import cluster_book
from fairq_server.runtime.loop_tools import LoopTools
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.attempt_stream import AttemptSink, StreamLauncher, attempt_stream
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.in_force import Settings
from fairq_server.scheduling.interfaces import GateOutcome
from fairq_server.scheduling.ticket import AttemptHandle, Ticket
from fairq_server.tenancy.books.cluster import ClusterBook, Ride

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
        relayed = super().text(delta)  # the caller's token before the Redis write
        if self._on_first is not None:
            on_first, self._on_first = self._on_first, None
            on_first()
        return relayed

    def ended(self, end: StreamEnd) -> None:
        self._on_first = None
        super().ended(end)


def shared_view(
    backend: BackendState, tier: str, peer_awaiting: int, peer_in_flight: int
) -> BackendState:
    """Return a copy of ``backend`` as a reservation sees it.

    The request being reserved (one of ``tier``) is not counted yet; the other replicas'
    requests are as Redis counts them. A copy: the backend's state is the dispatcher's.
    """
    view = copy.copy(backend)
    view.in_flight = max(0, backend.in_flight - 1)
    view.awaiting_first_token = max(0, backend.awaiting_first_token - 1)
    view.tier_in_flight = dict(backend.tier_in_flight)
    view.tier_in_flight[tier] = max(0, view.tier_in_flight.get(tier, 0) - 1)
    view.peer_awaiting, view.peer_in_flight = peer_awaiting, peer_in_flight
    return view


class ClusterLauncher(StreamLauncher):
    """Reserves each attempt's slot in the shared gate before reading its backend stream.

    Args:
        post: the dispatcher's inbox.
        window: read pacing (see :class:`StreamLauncher`).
        node: this replica's cluster membership.
        settings: the dispatcher's current settings (its tiers and configured gate).
        clock: the dispatcher's clock (the gate's staleness check).
        tools: the loop's share, pace and clock the readers use (a fresh set if None).

    """

    def __init__(
        self,
        post: Callable[[ev.Event], None],
        window: float,
        node: ClusterNode,
        settings: Callable[[], Settings],
        clock: Callable[[], float],
        tools: LoopTools | None = None,
    ) -> None:
        super().__init__(post, window, tools)
        #: The cluster's limit book (the dispatcher's too): a request's quota reservation
        #: rides on its slot claim.
        self.quota: ClusterBook = cluster_book(node)
        self._node = node
        self._settings = settings
        self._clock = clock
        self._seq = itertools.count()
        # The member each reading attempt holds; members kept for a hand-over, not released
        # when their attempt ends; and the slot (backend, member) each new attempt inherits.
        self._holding: dict[Ticket, tuple[str, str]] = {}
        self._kept: set[str] = set()
        self._handed: dict[Ticket, tuple[str, str]] = {}
        # Ended attempts' slots kept for their user's next request, with their safety timers.
        self._parked: dict[Ticket, tuple[str, str, asyncio.TimerHandle]] = {}
        #: Idle slots claimed ahead in the shared gate, spent by dispatches with no round trip.
        self.credit = Credit(node, node.config.credit_slots, self._room)

    def hand_over(self, victim: Ticket, to: Ticket) -> None:
        """Give the slot ``victim`` holds (about to be aborted, or ended and parked) to ``to``.

        Without a slot held yet (still reserving), ``to`` reserves one as usual.
        """
        parked = self._parked.pop(victim, None)
        if parked is not None:
            parked[2].cancel()
            self._handed[to] = (parked[0], parked[1])
            return
        slot = self._holding.pop(victim, None)
        if slot is not None:
            self._kept.add(slot[1])
            self._handed[to] = slot

    def let_go(self, ended: Ticket) -> None:
        """Release the slot parked for ``ended``'s user (no hold, or it lapsed)."""
        parked = self._parked.pop(ended, None)
        if parked is not None:
            parked[2].cancel()
            self._node.release(parked[0], parked[1])

    def _park(self, ticket: Ticket, backend_id: str, member: str) -> None:
        """Keep ``member`` claimed for ``ticket``'s user's next request (see :meth:`let_go`)."""
        bound = self._settings().config.anticipation_seconds
        # The dispatcher lets it go when its hold lapses; this only bounds a lost decision.
        timer = asyncio.get_running_loop().call_later(2 * bound + 1.0, self.let_go, ticket)
        self._parked[ticket] = (backend_id, member, timer)

    def __call__(self, ticket: Ticket) -> AttemptHandle:
        """Start ``ticket``'s attempt: reserve, then read (a task; cancel it to abort)."""
        backend = ticket.backend
        assert backend is not None
        handed = self._handed.pop(ticket, None)
        if handed is not None and handed[0] == backend.id:
            member = handed[1]  # the victim's attempt, ending, leaves it held (_kept)
        else:
            member = f"{self._node.replica_id}|{next(self._seq)}"
            if handed is not None:  # cannot happen (started where it was freed); kept safe
                self._node.release(*handed)
            handed = None
        self._node.fair.wake()  # a dispatch here: share the counters soon
        claim = ticket.claim
        ride = self.quota.ride(claim.grant if claim is not None else None)
        if handed is None and ride is None:
            credit = self._spend(ticket, ticket.attempt, backend)
            if credit is not None:  # counted in the shared gate already: no round trip
                self._node.metrics.reservations.labels(backend.id, "credit").inc()
                reader = self._read(ticket, backend, credit)
                reader.add_done_callback(
                    lambda task: self._done(ticket, backend.id, credit, aborted=task.cancelled())
                )
                return reader
        return asyncio.create_task(
            self._run(ticket, ticket.attempt, backend, member, ride, handed=handed is not None)
        )

    def _admits(
        self, ticket: Ticket, attempt: int, backend: BackendState, peers: tuple[int, int]
    ) -> bool:
        """Whether the configured gate admits ``ticket`` with the other replicas' ``peers``.

        The gate the dispatcher consulted: that of the tier the request went under (an aged
        request goes under the tier it overtook). An attempt aborted meanwhile is not.
        """
        if ticket.attempt != attempt:
            return False
        settings = self._settings()
        tier = settings.tiers[ticket.tier].name
        under = settings.tiers[
            ticket.priority_tier if ticket.priority_tier is not None else ticket.tier
        ]
        view = shared_view(backend, tier, *peers)
        stale_after = settings.config.stale_after_seconds
        try:
            outcome = settings.policies.gate.check(view, under, self._clock(), stale_after)
        except Exception:  # a faulty plugin: the member must still be withdrawn
            log.exception("gate check of a reservation on %s failed", backend.id)
            return False
        return outcome is GateOutcome.ADMIT

    def _room(self, view: BackendState) -> bool:
        """Whether the configured gate admits a request of every tier on ``view``."""
        settings = self._settings()
        gate, now, stale_after = (
            settings.policies.gate,
            self._clock(),
            settings.config.stale_after_seconds,
        )
        try:
            return all(
                gate.check(view, tier, now, stale_after) is GateOutcome.ADMIT
                for tier in settings.tiers
            )
        except Exception:  # a faulty plugin: no credit
            log.exception("gate check of a credit on %s failed", view.id)
            return False

    def _spend(self, ticket: Ticket, attempt: int, backend: BackendState) -> str | None:
        """Return an idle credit slot's member for ``ticket`` (None: reserve in Redis)."""
        peers = (backend.peer_awaiting, backend.peer_in_flight)
        if not self.credit.idle(backend.id) or not self._admits(ticket, attempt, backend, peers):
            return None
        return self.credit.spend(backend)

    def _first(self, backend: BackendState, member: str) -> None:
        """Take a request's first token: its member leaves ``await``; top the credit up.

        Not sooner: claiming while the request is on its way competes with it for this
        process and for Redis, and a slot of the queue is free again only now.
        """
        self._node.first_token(backend.id, member)
        self.credit.refill(backend)

    def _read(self, ticket: Ticket, backend: BackendState, member: str) -> asyncio.Task[None]:
        """Start reading the backend stream of ``ticket``, which holds ``member``."""
        self._holding[ticket] = (backend.id, member)
        sink = _FirstTokenSink(self._post, ticket, lambda: self._first(backend, member))
        return start_reading(attempt_stream(ticket), sink, self.window, self.tools)

    def _done(self, ticket: Ticket, backend_id: str, member: str, *, aborted: bool) -> None:
        """Release ``member``, its attempt ended (unless kept for a hand-over, or parked).

        ``aborted``: cancelled (the caller left, or a preemption): never parked.
        """
        if self._holding.get(ticket) == (backend_id, member):
            del self._holding[ticket]
        if member in self._kept:
            self._kept.discard(member)
        elif not aborted and ticket.generating and self._may_park(ticket):
            self._park(ticket, backend_id, member)
        else:
            self._node.release(backend_id, member)

    def _may_park(self, ticket: Ticket) -> bool:
        try:
            return self.may_hold(ticket)
        except Exception:  # never let a slot leak for a failed check
            log.exception("anticipation check of request %s failed", ticket.request.request_id)
            return False

    async def _run(
        self, ticket: Ticket, attempt: int, backend: BackendState, member: str,
        ride: Ride | None, *, handed: bool,
    ) -> None:  # fmt: skip
        node = self._node
        backend_id = backend.id
        held = False
        aborted = True  # until its stream has been read to its end
        try:
            if node.reserving:
                started = time.perf_counter()
                with_idle = self.credit.with_idle  # a slot spent later adds a request unchecked
                granted = await node.reserve(
                    backend_id, member,
                    lambda p: self._admits(ticket, attempt, backend, with_idle(backend_id, p)),
                    ride.calls if ride else (), ride.replies if ride else None, handed=handed,
                )  # fmt: skip
                node.metrics.reserve_seconds.observe(time.perf_counter() - started)
                # Refused by a quota: the slot back, the request to the dispatcher, whose next
                # dispatch of it meets the refusal. (A quota grant with a refused slot is
                # settled with nothing when the request is queued again.)
                if ride is not None and not await self.quota.confirm(ride, time.time()):
                    if granted:
                        node.release(backend_id, member)
                    granted = False
                if not granted:
                    # Refused, or Redis just lost (None): the request was admitted against
                    # the shared view, so it queues again and the gate decides afresh (on
                    # the local share, if Redis is gone). Aborted meanwhile: stale, ignored.
                    self._post(ev.Refused(ticket, attempt))
                    return
            else:  # Redis unreachable: forwarded on the local share
                if not await self.quota.confirm(ride, time.time()):
                    self._post(ev.Refused(ticket, attempt))
                    return
                node.metrics.reservations.labels(backend_id, "local").inc()
                node.hold_local(backend_id, member)
            held = True
            if ticket.attempt != attempt:
                return  # aborted while reserving
            # Awaiting the reader: cancelling this task (an abort) cancels the reader too.
            await self._read(ticket, backend, member)
            aborted = False
        finally:
            if held:
                self._done(ticket, backend_id, member, aborted=aborted)
            else:
                self._kept.discard(member)
