"""A replica's credit: slots of the shared gate claimed ahead, so a dispatch sends at once.

Without credit every request waits one Redis round trip (the reservation) before its backend
request leaves. With credit, the replica holds up to ``cluster.credit_slots`` members per
backend in the shared gate that no request uses yet: claimed in the background with the same
script and the same gate plugin as a reservation, leased and renewed with the replica's
other members, and counted by every replica as tokenless and in flight, exactly as a request
would be. A request dispatched here takes one (no round trip) and its member becomes the
request's (first token and end as for any reservation).
With no idle slot the request reserves as before.

Why the threshold still holds: every member in Redis, idle or not, was admitted by the gate
with every member found before it counted (this replica's idle ones too, also by an ordinary
reservation), so requests without a first token plus idle credit never pass what the gate
allows, and spending turns an idle slot into a request without changing that sum. A credit
is only claimed while the gate, with it counted, would still admit one more request of every
tier (a slot of headroom), and idle credit goes back as soon as the counts show the backend
full for any tier: a replica with nothing to send never holds a slot another replica's
request needs. A killed replica's credit expires with its lease; a lost Redis drops it (the
replica is on its local share). The next slot is claimed after the spending request's first
token (:meth:`ClusterLauncher._first <fairq_server.cluster.launcher.ClusterLauncher>`).
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fairq_server.scheduling.backend_state import BackendState

if TYPE_CHECKING:
    from fairq_server.cluster.node import ClusterNode

__all__ = ["Credit", "Room"]

#: Whether the gate admits one more request of every tier on a backend as a view shows it.
Room = Callable[[BackendState], bool]


class Credit:
    """The idle slots one replica holds in the shared gate, per backend.

    Args:
        node: this replica's cluster membership (its reservations and background tasks).
        slots: idle slots to hold per backend (0: no credit, every request reserves).
        room: the configured gate's answer for a view of a backend (every tier admits).

    """

    def __init__(self, node: ClusterNode, slots: int, room: Room) -> None:
        self._node = node
        self._slots = slots
        self._room = room
        self._idle: dict[str, list[tuple[str, float]]] = {}  # member, loop time claimed
        self._claiming: set[str] = set()
        self._backends: dict[str, BackendState] = {}
        self._seq = itertools.count()
        # Loop time of the last renewal of every member held (a claim's lease starts then too).
        self._renewed = time.monotonic()
        self._fresh_for = 2 * node.config.lease_seconds / 3
        node.on_counts = self._counted
        node.on_lost = self.give_back
        node.on_renew = self._renewing

    def idle(self, backend_id: str) -> int:
        """Idle slots held on ``backend_id``."""
        return len(self._idle.get(backend_id, ()))

    def with_idle(self, backend_id: str, peers: tuple[int, int]) -> tuple[int, int]:
        """Return ``peers`` (other replicas' counts) with this replica's idle slots added.

        A reservation counts them so: a slot spent later adds a request with no check.
        """
        idle = self.idle(backend_id)
        return peers[0] + idle, peers[1] + idle

    def spend(self, backend: BackendState) -> str | None:
        """Take an idle slot of ``backend`` for a request: its member (None: none idle).

        The launcher claims the next one (:meth:`refill`) after the request's first token.
        """
        if not self._slots or not self._node.connected:
            return None
        members = self._idle.get(backend.id)
        if not members:
            return None
        now = time.monotonic()
        if now - max(self._renewed, members[-1][1]) > self._fresh_for:
            self.give_back()  # renewals late (the replica paused?): its lease may have run out
            return None
        member, _ = members.pop()
        self._node.metrics.credit.labels(backend.id, "spent").inc()
        return member

    def refill(self, backend: BackendState) -> None:
        """Claim idle slots of ``backend`` up to the credit, in the background (one at a time)."""
        self._backends[backend.id] = backend
        if (
            self._slots
            and backend.id not in self._claiming
            and self._node.connected
            and self.idle(backend.id) < self._slots
        ):
            self._claiming.add(backend.id)
            self._node.spawn(self._claim(backend))

    async def _claim(self, backend: BackendState) -> None:
        node, backend_id = self._node, backend.id
        try:
            # After the first token and release writes queued before: a request that just
            # left the queue is not counted in it by the claim's counts.
            async with node.gate_writes:
                pass
            while node.connected and not backend.draining and self.idle(backend_id) < self._slots:
                member = f"{node.replica_id}|c{next(self._seq)}"
                claimed = time.monotonic()
                # Counted as the other replicas' with this replica's idle slots and the one
                # claimed: the gate must still admit one more request with all of them.
                admit = functools.partial(self._admits, backend, 1)
                granted = await node.reserve(backend_id, member, admit, counted=False)
                node.metrics.credit.labels(backend_id, "claimed" if granted else "refused").inc()
                if not granted:
                    return  # no room (or Redis lost): the next dispatch tries again
                if not node.connected:  # lost while claiming: given back like the rest
                    node.release(backend_id, member)
                    return
                self._idle.setdefault(backend_id, []).append((member, claimed))
        finally:
            self._claiming.discard(backend_id)

    def _admits(self, backend: BackendState, extra: int, peers: tuple[int, int]) -> bool:
        """Whether every tier's gate admits a request with ``peers``, idle and ``extra`` slots."""
        view = copy.copy(backend)  # the backend's state is the dispatcher's
        awaiting, in_flight = self.with_idle(backend.id, peers)
        view.peer_awaiting, view.peer_in_flight = awaiting + extra, in_flight + extra
        return self._room(view)

    def _counted(self, backend_id: str, peers: tuple[int, int]) -> None:
        """Fresh counts of ``backend_id``: give its idle slots back if it is full for any tier.

        Also when it drains (it is on its way out: nothing will be sent there).
        """
        backend = self._backends.get(backend_id)
        idle = self.idle(backend_id)
        if backend is None or not idle:
            return
        if backend.draining or not self._admits(backend, 0, peers):
            self._give_back(backend_id)

    def give_back(self) -> None:
        """Give every idle slot back (Redis lost, or leaving the cluster)."""
        for backend_id in list(self._idle):
            self._give_back(backend_id)

    def _renewing(self) -> None:
        """Keep idle slots through a renewal (which sets every member held) only if live.

        Renewals more than two thirds of a lease apart (the replica was paused, or its loop
        stalled): an idle slot may have expired and been taken by another replica meanwhile;
        set again and spent, it would put a request past the threshold. It goes back instead.
        """
        now = time.monotonic()
        if now - self._renewed > self._fresh_for:
            self.give_back()
        self._renewed = now

    def _give_back(self, backend_id: str) -> None:
        members = self._idle.pop(backend_id, [])
        for member, _ in members:
            self._node.release(backend_id, member)
        if members:
            self._node.metrics.credit.labels(backend_id, "returned").inc(len(members))
