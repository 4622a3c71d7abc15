"""Per-user service counters of one tier: the state fairness shares in a cluster.

A fairness policy keeps each user's standing in a :class:`~.interfaces.ServiceCounters`
given to it at construction. On one process that is a :class:`LocalCounters` (a table). In a
cluster it is a :class:`JournaledCounters`: the same table, plus a journal of what this
replica changed (charges as deltas, lifts as "at least"), which the cluster's sync task flushes
to Redis; the shared counters come back through :meth:`JournaledCounters.adopt`, with the other
replicas' heads (their two smallest backlogged users). So whatever policy keeps its counters
here is fair across the cluster with no code of its own for it.

The tier queue tells the counters which users are backlogged here
(:meth:`LocalCounters.backlogged`), and the dispatch pass asks :meth:`LocalCounters.may_serve`
before serving a user: in a cluster a user whose counter is above the smallest counter of anyone
else backlogged on another replica (plus a slack) waits, and that replica takes the slot.
Everything here is written by the dispatcher loop only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["Heads", "Journal", "JournaledCounters", "LocalCounters", "PeerHeads"]

#: A replica's smallest backlogged users, as ``(user, counter)`` pairs, smallest first.
Heads = tuple[tuple[str, float], ...]


@dataclass
class Journal:
    """What this replica changed in the shared counters since the last flush.

    Attributes:
        floors: users lifted, to at least this counter.
        deltas: charges per user (already divided by the weight).

    """

    floors: dict[str, float] = field(default_factory=dict)
    deltas: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PeerHeads:
    """The other replicas' smallest backlogged counters, as ``(user, counter)`` pairs.

    Each replica contributes its head and the runner-up of another user, so the smallest
    counter of anyone but a given user is always among them.
    """

    pairs: Heads = ()

    def floor(self, user: str | None = None) -> float | None:
        """Return the smallest counter of a user other than ``user`` (None: nobody else)."""
        return min((c for u, c in self.pairs if u != user), default=None)


class LocalCounters:
    """One process's counters: a table; nobody else shares them.

    Implements :class:`~fairq_server.scheduling.interfaces.ServiceCounters` for the policy,
    and the tier queue's side (backlog, :meth:`may_serve`, the sync) as no-ops.
    """

    shared = False
    #: The other replicas' heads (none on one process; a cluster's counters adopt them).
    peer_heads = PeerHeads()

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._watchers: list[Callable[[str], None]] = []

    # -- the policy's side (ServiceCounters) ----------------------------------------------

    def get(self, user: str) -> float | None:
        """See :meth:`ServiceCounters.get`."""
        return self._values.get(user)

    def lift(self, user: str, floor: float) -> None:
        """See :meth:`ServiceCounters.lift`."""
        current = self._values.get(user)
        if current is None or current < floor:
            self._values[user] = floor

    def add(self, user: str, amount: float) -> None:
        """See :meth:`ServiceCounters.add`."""
        if user in self._values:
            self._values[user] += amount

    def forget(self, user: str) -> None:
        """See :meth:`ServiceCounters.forget`."""
        self._values.pop(user, None)

    def floor(self, user: str) -> float | None:
        """See :meth:`ServiceCounters.floor` (nobody elsewhere: None)."""
        return None

    def watch(self, changed: Callable[[str], None]) -> None:
        """See :meth:`ServiceCounters.watch`."""
        self._watchers.append(changed)

    # -- the tier queue's and the dispatcher's side -----------------------------------------

    def backlogged(self, user: str, active: bool) -> None:
        """Note that ``user``'s queue here became non-empty (``active``) or empty."""

    def tracked(self, name: str, active: bool) -> None:
        """Note that counter ``name`` is (``active``) or no longer is read back from a cluster.

        For counters that are not a tier's unit of fairness between replicas (a team
        member's, inside its team): read back like a backlogged user's, never a head.
        """

    def may_serve(self, user: str) -> bool:
        """Whether ``user`` may be served here now (always, on one process)."""
        return True

    def take_journal(
        self, waits: Callable[[str], bool] | None = None
    ) -> tuple[Journal, list[str], Heads] | None:
        """Start a new journal; return the old one, the backlogged users and the heads.

        None: nothing is shared (one process).
        """
        return None

    def adopt(self, counters: Mapping[str, float], heads: PeerHeads) -> None:
        """Take the shared counters and the other replicas' heads (cluster only)."""


class JournaledCounters(LocalCounters):
    """A replica's counters in a cluster: journaled for Redis, adopting the shared values.

    Args:
        slack: a user is served only while its counter is within this of the smallest
            counter of anyone else backlogged on another replica (see :meth:`may_serve`).
        on_backlogged: told when a user becomes backlogged here (its head may be the new
            floor of the others: share it soon).

    """

    shared = True

    def __init__(self, slack: float = 0.0, on_backlogged: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.slack = slack
        self.journal = Journal()
        self.peer_heads = PeerHeads()
        self._on_backlogged = on_backlogged
        self._active: dict[str, None] = {}  # backlogged here, in order of becoming so
        self._tracked: dict[str, None] = {}  # read back too, never heads

    def lift(self, user: str, floor: float) -> None:
        """Raise ``user`` to ``floor``; a raise is journaled (a new record is not)."""
        current = self._values.get(user)
        super().lift(user, floor)
        if current is not None and current < floor:
            self.journal.floors[user] = max(self.journal.floors.get(user, 0.0), floor)

    def add(self, user: str, amount: float) -> None:
        """Charge ``user``; journaled even without a record here (it may be queued elsewhere)."""
        self.journal.deltas[user] = self.journal.deltas.get(user, 0.0) + amount
        super().add(user, amount)

    def floor(self, user: str) -> float | None:
        """Return the smallest counter of another user backlogged elsewhere (as last read)."""
        return self.peer_heads.floor(user)

    def backlogged(self, user: str, active: bool) -> None:
        """See :meth:`LocalCounters.backlogged`; a newly backlogged user is shared soon."""
        if not active:
            self._active.pop(user, None)
            return
        self._active[user] = None
        if self._on_backlogged is not None:
            self._on_backlogged()

    def tracked(self, name: str, active: bool) -> None:
        """See :meth:`LocalCounters.tracked`."""
        if active:
            self._tracked[name] = None
        else:
            self._tracked.pop(name, None)

    def may_serve(self, user: str) -> bool:
        """Whether ``user`` is within the slack of anyone else's counter on the other replicas."""
        floor = self.peer_heads.floor(user)
        value = self._values.get(user)
        return floor is None or value is None or value <= floor + self.slack + 1e-9

    def take_journal(
        self, waits: Callable[[str], bool] | None = None
    ) -> tuple[Journal, list[str], Heads]:
        """See :meth:`LocalCounters.take_journal`.

        The heads are the two backlogged users with the smallest counters here, smallest
        first (fewer when fewer are backlogged), leaving out those ``waits`` names: users in
        the idle-only band wait for in-quota work anywhere, so no other replica waits for
        them (this replica knows best which of its users are over a soft limit).
        """
        journal, self.journal = self.journal, Journal()
        active = list(self._active)
        entries = [(v, u) for u in active if (v := self._values.get(u)) is not None]
        if waits is None:
            ranked = heapq.nsmallest(2, entries)
        else:  # smallest first, asking ``waits`` only until two heads are found
            heapq.heapify(entries)
            ranked = []
            while entries and len(ranked) < 2:
                entry = heapq.heappop(entries)
                if not waits(entry[1]):
                    ranked.append(entry)
        return journal, active + list(self._tracked), tuple((u, v) for v, u in ranked[:2])

    def adopt(self, counters: Mapping[str, float], heads: PeerHeads) -> None:
        """Take the shared counters (plus what was journaled since), and the peers' heads.

        Users without a record here are skipped; the policy is told of every change.
        """
        pending = self.journal
        for user, value in counters.items():
            current = self._values.get(user)
            if current is None:
                continue
            value = max(value, pending.floors.get(user, value)) + pending.deltas.get(user, 0.0)
            if value != current:
                self._values[user] = value
                for changed in self._watchers:
                    changed(user)
        self.peer_heads = heads
