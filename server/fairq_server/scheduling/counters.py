"""Per-user service counters of one tier: the state fairness shares in a cluster.

A fairness policy keeps each user's standing in a :class:`~.interfaces.ServiceCounters`
given to it at construction. On one process that is a :class:`LocalCounters` (a table). In a
cluster it is a :class:`JournaledCounters`: the same table, plus a journal of what this
replica changed (charges as deltas, lifts as "at least"), which the cluster's sync task flushes
to Redis; the shared counters come back through :meth:`JournaledCounters.adopt`, with the other
replicas' heads (their two smallest backlogged users). So whatever policy keeps its counters
here is fair across the cluster with no code of its own for it.

Counters inside a group (a team's members, each measured only against its own team) have heads
of their own, per group: a member is served only while its counter is within the slack of the
smallest counter of another member of the same group backlogged elsewhere. Without them, the
members of one team on different replicas got the team's turns in the order their replicas
reserved slots, not by their standing.

The tier queue tells the counters which users are backlogged here
(:meth:`LocalCounters.backlogged`), and the dispatch pass asks :meth:`LocalCounters.may_serve`
before serving a user: in a cluster a user whose counter is above the smallest counter of anyone
else backlogged on another replica (plus a slack) waits, and that replica takes the slot.
Everything here is written by the dispatcher loop only.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "HELD_SYNC_SECONDS",
    "Heads",
    "Journal",
    "JournaledCounters",
    "LocalCounters",
    "MemberHeads",
    "PeerHeads",
]

#: While dispatches here are held for another replica, a sync at least this often (one Redis
#: round trip per held replica and interval; what stale heads can stall the cluster for).
HELD_SYNC_SECONDS = 0.05

#: A replica's smallest backlogged users, as ``(user, counter)`` pairs, smallest first.
Heads = tuple[tuple[str, float], ...]
#: A replica's smallest backlogged members of each group, as ``(group, name, counter)``.
MemberHeads = tuple[tuple[str, str, float], ...]


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
    counter of anyone but a given user is always among them; and the same for each group's
    members (``members``).
    """

    pairs: Heads = ()
    members: MemberHeads = ()

    def floor(self, user: str | None = None) -> float | None:
        """Return the smallest counter of a user other than ``user`` (None: nobody else)."""
        return min((c for u, c in self.pairs if u != user), default=None)

    def member_floor(self, name: str, group: str) -> float | None:
        """Return the smallest counter of another member of ``group`` (None: nobody else)."""
        return min((c for g, n, c in self.members if g == group and n != name), default=None)


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

    def tracked(self, name: str, active: bool, group: str) -> None:
        """Note that counter ``name`` of ``group`` is (``active``) or no longer is backlogged.

        For counters that are not a tier's unit of fairness between replicas (a team
        member's, inside its team ``group``): read back like a backlogged user's, and heads
        only against the same group's members (:meth:`may_serve_member`).
        """

    def may_serve(self, user: str) -> bool:
        """Whether ``user`` may be served here now (always, on one process)."""
        return True

    def may_serve_member(self, name: str, group: str) -> bool:
        """Whether member counter ``name`` of ``group`` may be served now (one process: yes)."""
        return True

    def take_journal(
        self, waits: Callable[[str], bool] | None = None
    ) -> tuple[Journal, list[str], Heads, MemberHeads] | None:
        """Start a new journal; return the old one, the names to read back and the heads.

        The heads are the users' and, per group, the members'. None: nothing is shared
        (one process).
        """
        return None

    def adopt(self, counters: Mapping[str, float], heads: PeerHeads) -> None:
        """Take the shared counters and the other replicas' heads (cluster only)."""


class JournaledCounters(LocalCounters):
    """A replica's counters in a cluster: journaled for Redis, adopting the shared values.

    Args:
        slack: a user is served only while its counter is within this of the smallest
            counter of anyone else backlogged on another replica (see :meth:`may_serve`).
        on_backlogged: told when a user or member becomes backlogged here (its head may be
            the new floor of the others: share it soon), and while a dispatch here is held
            (at most every :data:`HELD_SYNC_SECONDS`).

    """

    shared = True

    def __init__(self, slack: float = 0.0, on_backlogged: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.slack = slack
        self.journal = Journal()
        self.peer_heads = PeerHeads()
        self._on_backlogged = on_backlogged
        self._active: dict[str, None] = {}  # backlogged here, in order of becoming so
        self._tracked: dict[str, str] = {}  # members backlogged here -> their group
        self._held_sync = 0.0  # when a held dispatch last asked for a sync

    def lift(self, user: str, floor: float) -> None:
        """Raise ``user`` to ``floor``; journaled as "at least", whatever the value here.

        The shared counter is the truth, and this replica's value may be ahead of it: a new
        record's start (the shared counter of a user new to the cluster is 0, and adopting
        ``0 + charges`` put a newcomer far below a user who had run alone, which then got
        nothing until the newcomer caught up: 20 s for 20 s alone), or a record kept here
        for a user whose shared counter was forgotten (idle in the whole cluster). Redis
        takes the larger of the two, so a lift never lowers anyone.
        """
        super().lift(user, floor)
        self.journal.floors[user] = max(self.journal.floors.get(user, floor), floor)

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

    def tracked(self, name: str, active: bool, group: str) -> None:
        """See :meth:`LocalCounters.tracked`; a newly backlogged member is shared soon."""
        if not active:
            self._tracked.pop(name, None)
            return
        self._tracked[name] = group
        if self._on_backlogged is not None:
            self._on_backlogged()

    def may_serve(self, user: str) -> bool:
        """Whether ``user`` is within the slack of anyone else's counter on the other replicas."""
        return self._within(self._values.get(user), self.peer_heads.floor(user))

    def may_serve_member(self, name: str, group: str) -> bool:
        """Whether member ``name`` is within the slack of its group's others elsewhere."""
        return self._within(self._values.get(name), self.peer_heads.member_floor(name, group))

    def _within(self, value: float | None, floor: float | None) -> bool:
        if floor is None or value is None or value <= floor + self.slack + 1e-9:
            return True
        # Held for a replica further behind. Charges move counters between dispatches
        # without a sync, so the heads holding this replica (or this replica's, holding the
        # one it waits for) may be stale; when every replica is held, nothing else would
        # sync them before the lease's timer (1.7 s stalls of a three-replica cluster).
        now = time.monotonic()
        if self._on_backlogged is not None and now - self._held_sync >= HELD_SYNC_SECONDS:
            self._held_sync = now
            self._on_backlogged()
        return False

    def take_journal(
        self, waits: Callable[[str], bool] | None = None
    ) -> tuple[Journal, list[str], Heads, MemberHeads]:
        """See :meth:`LocalCounters.take_journal`.

        The heads are the two backlogged users with the smallest counters here, smallest
        first (fewer when fewer are backlogged), leaving out those ``waits`` names: users in
        the idle-only band wait for in-quota work anywhere, so no other replica waits for
        them (this replica knows best which of its users are over a soft limit). The same,
        per group, for the members backlogged here (``waits`` is asked their names).
        """
        journal, self.journal = self.journal, Journal()
        active = list(self._active)
        heads = _smallest(active, self._values, waits)
        groups: dict[str, list[str]] = {}
        for name, group in self._tracked.items():
            groups.setdefault(group, []).append(name)
        members = tuple(
            (group, name, value)
            for group, names in groups.items()
            for name, value in _smallest(names, self._values, waits)
        )
        return journal, active + list(self._tracked), heads, members

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


def _smallest(
    names: list[str], values: Mapping[str, float], waits: Callable[[str], bool] | None
) -> Heads:
    """Return the two of ``names`` with the smallest values, smallest first, not ``waits``'."""
    entries = [(v, u) for u in names if (v := values.get(u)) is not None]
    if waits is None:
        ranked = heapq.nsmallest(2, entries)
    else:  # smallest first, asking ``waits`` only until two heads are found
        heapq.heapify(entries)
        ranked = []
        while entries and len(ranked) < 2:
            entry = heapq.heappop(entries)
            if not waits(entry[1]):
                ranked.append(entry)
    return tuple((u, v) for v, u in ranked)
