"""Shared machinery of the counter-based fairness policies.

Each policy keeps a service counter per user and serves the backlogged user with the smallest
counter; they differ in what they charge (see :mod:`.round_robin`, :mod:`.vtc`). The counters
live in a heap with lazy updates: charges only ever raise a counter, so a heap entry whose key
is lower than its user's current counter is simply re-pushed when it surfaces. Every operation
is O(log n) amortised.

A user whose queue goes from empty to non-empty is lifted to the smallest counter among
backlogged users (or, with none backlogged, to the counter of the last user served): idle time
cannot be banked as credit and spent later in a burst (Sheng et al., OSDI 2024).

In a cluster the counters are shared through Redis (:mod:`fairq_server.cluster.fairness`):
charges and lifts go to a :class:`Journal` the replica flushes, :meth:`adopt` takes the global
counters back, and :meth:`may_serve` holds a user whose counter is above the smallest counter
of any *other* user backlogged on the other replicas (plus a slack): each replica publishes
its two smallest backlogged users (:class:`PeerHeads`), so a user spread over several
replicas is never held back by its own, older counter there. Without a cluster none of this
is used.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fairq_server.scheduling.interfaces import Cost

__all__ = ["CounterFairness", "Journal", "PeerHeads"]

_FRESH = 1 << 62


@dataclass
class _UserState:
    counter: float = 0.0
    weight: float = 1.0
    active: bool = False
    stamp: int = -1  # the stamp of this user's one valid heap entry


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

    pairs: tuple[tuple[str, float], ...] = ()

    def floor(self, user: str | None = None) -> float | None:
        """Return the smallest counter of a user other than ``user`` (None: nobody else)."""
        return min((c for u, c in self.pairs if u != user), default=None)


class CounterFairness:
    """Shared machinery: serve the active user with the smallest counter.

    Ties go to the user whose entry was pushed first, which makes equal counters rotate in
    round-robin order. A user lifted on becoming backlogged goes before users who reached
    that counter by being served: it joins the rotation next, as in round-robin, instead of
    after one more turn of everyone already there (a user that was not lifted had its turn
    at this counter and queues behind as usual). Subclasses decide what a :class:`Cost` is
    worth (:meth:`price`).

    Args:
        lift: lift a user who becomes backlogged to the smallest active counter (the default,
            and the only fair choice). ``lift=False`` keeps whatever counter the user had (0
            for a new one) and never forgets an idle user, so idle time is banked as credit:
            a baseline for benchmarks that show what the lift prevents.

    """

    def __init__(self, *, lift: bool = True) -> None:
        self._lift = lift
        self._users: dict[str, _UserState] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._next_stamp = 0  # an int, not itertools.count: policies are deep-copied
        self._virtual_time = 0.0
        self._active = 0
        # Idle users whose counter was above the virtual time when they went idle: forgotten
        # once the virtual time passes them (a returning user is lifted that far anyway), so
        # memory follows active users, not every user name ever seen.
        self._idle: list[tuple[float, str]] = []
        # Cluster only (see the module docstring): None on one process.
        self.journal: Journal | None = None
        self.peer_heads = PeerHeads()
        self.slack = 0.0
        self.on_backlogged: Callable[[], None] | None = None  # share the new head soon

    def _push(self, user: str, state: _UserState, *, fresh: bool = False) -> None:
        # Activation stamps sort before every stamp given after a charge, in arrival order.
        state.stamp = self._next_stamp - (_FRESH if fresh else 0)
        self._next_stamp += 1
        heapq.heappush(self._heap, (state.counter, state.stamp, user))

    def _clean_top(self) -> tuple[float, int, str] | None:
        """Drop dead entries and refresh stale ones until the top is exact."""
        heap = self._heap
        while heap:
            counter, stamp, user = heap[0]
            state = self._users.get(user)
            if state is None or not state.active or stamp != state.stamp:
                heapq.heappop(heap)
            elif counter < state.counter:  # charged since it was pushed
                heapq.heappop(heap)
                self._push(user, state)
            else:
                return heap[0]
        return None

    def activate(self, user: str, weight: float, *, resume: bool = False) -> None:
        """See :meth:`FairnessPolicy.activate`."""
        state = self._users.get(user)
        if state is None:
            # New, or forgotten at a counter <= the virtual time: it starts there, so a user
            # served moments ago and forgotten is not mistaken for one that was never served.
            start = self._virtual_time if self._lift else 0.0
            state = self._users[user] = _UserState(counter=start)
        if state.active:
            return
        state.weight = weight if weight > 0 else 1.0
        if not self._lift or resume:
            # Resumed: a lift would take away the standing a refused dispatch just gave back,
            # and with refusals at random, users' service would drift apart.
            state.active = True
            self._active += 1
            self._push(user, state)
            if resume and self.on_backlogged is not None:
                self.on_backlogged()
            return
        top = self._clean_top()
        floor = top[0] if top is not None else self._virtual_time
        peer_floor = self.peer_heads.floor(user)
        if peer_floor is not None:
            # The smallest counter backlogged on the other replicas (as last read).
            floor = peer_floor if top is None else min(floor, peer_floor)
        lifted = state.counter < floor
        state.counter = max(state.counter, floor)
        if lifted and self.journal is not None:
            self.journal.floors[user] = max(self.journal.floors.get(user, 0.0), floor)
        if self.on_backlogged is not None:
            self.on_backlogged()
        state.active = True
        self._active += 1
        self._push(user, state, fresh=lifted)

    def deactivate(self, user: str) -> None:
        """See :meth:`FairnessPolicy.deactivate`."""
        state = self._users.get(user)
        if state is None or not state.active:
            return
        state.active = False
        self._active -= 1
        if not self._lift:
            return  # the record, and its low counter, stay: that is the baseline's point
        if self._active == 0 and self.journal is None:
            # Nobody is backlogged: counters only matter relative to backlogged users, so the
            # history can go. Everyone who comes back is lifted to the highest counter seen,
            # which takes credit away from no one and keeps memory at zero between bursts.
            # Not in a cluster: users are backlogged on the other replicas, and a user whose
            # requests are all in flight here is still being charged. Dropped, it would come
            # back at the old counter (the charges since only journaled), be served at once
            # as if behind, until the next sync; kept, it is parked like any idle user.
            self._virtual_time = max(self._virtual_time, *(u.counter for u in self._users.values()))
            self._users.clear()
            self._idle.clear()
            return
        self._forget_or_park(user, state)

    def _forget_or_park(self, user: str, state: _UserState) -> None:
        # Keep an idle record only while it carries a counter above the floor a returning
        # user would get anyway. Charges arriving later carry their own weight.
        if state.counter <= self._virtual_time:
            del self._users[user]
        else:
            heapq.heappush(self._idle, (state.counter, user))

    def _prune(self) -> None:
        idle = self._idle
        while idle and idle[0][0] <= self._virtual_time:
            _, user = heapq.heappop(idle)
            state = self._users.get(user)
            if state is not None and not state.active:
                self._forget_or_park(user, state)

    def select(self) -> str:
        """See :meth:`FairnessPolicy.select`."""
        top = self._clean_top()
        if top is None:
            raise IndexError("select from a fairness policy with no active user")
        self._advance(top[0])
        return top[2]

    def _advance(self, counter: float) -> None:
        if counter > self._virtual_time:
            self._virtual_time = counter
            self._prune()

    def candidates(self, quantum: float, limit: int) -> list[str]:
        """See :meth:`FairnessPolicy.candidates`."""
        top = self._clean_top()
        if top is None:
            return []
        # The dispatcher serves one of these instead of calling select(), so advance the
        # virtual time here too; otherwise it stays behind and a user arriving at an empty
        # tier starts below everyone served since, taking that many turns in a burst.
        self._advance(top[0])
        bound = top[0] + quantum
        taken: list[tuple[float, int, str]] = []
        while len(taken) < limit:
            entry = self._clean_top()
            if entry is None or entry[0] > bound:
                break
            taken.append(heapq.heappop(self._heap))
        for entry in taken:
            heapq.heappush(self._heap, entry)
        return [user for _, _, user in taken]

    def counter(self, user: str) -> float:
        """See :meth:`FairnessPolicy.counter`."""
        state = self._users.get(user)
        return state.counter if state is not None else self._virtual_time

    def min_counter(self) -> float:
        """See :meth:`FairnessPolicy.min_counter`."""
        top = self._clean_top()
        return top[0] if top is not None else 0.0

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        """See :meth:`FairnessPolicy.charge`."""
        self._add(user, self.price(cost), weight)

    def _add(self, user: str, amount: float, weight: float | None = None) -> None:
        if not amount:
            return
        state = self._users.get(user)
        if self.journal is not None:
            # Shared even when no user is backlogged here: they may be elsewhere.
            w = weight if weight is not None and weight > 0 else state.weight if state else 1.0
            self.journal.deltas[user] = self.journal.deltas.get(user, 0.0) + amount / w
        if state is None:
            if self._active == 0:
                return  # nobody to be fair against: see deactivate()
            state = self._users[user] = _UserState(counter=self._virtual_time)
            # Created for an idle user by a late charge: make it prunable like the others.
            heapq.heappush(self._idle, (state.counter, user))
        w = weight if weight is not None and weight > 0 else state.weight
        state.counter += amount / w

    def price(self, cost: Cost) -> float:
        """Return what ``cost`` adds to a counter before the weight divides it."""
        raise NotImplementedError

    # -- cluster: shared counters -----------------------------------------------------------

    def take_journal(self) -> tuple[Journal, list[str], tuple[tuple[str, float], ...]]:
        """Start a new journal; return the old one, the backlogged users and the heads.

        The heads are the two backlogged users with the smallest counters here, smallest
        first (fewer when fewer are backlogged).
        """
        journal, self.journal = self.journal or Journal(), Journal()
        active = [u for u, s in self._users.items() if s.active]
        return journal, active, self._heads()

    def _heads(self) -> tuple[tuple[str, float], ...]:
        first = self._clean_top()
        if first is None:
            return ()
        heapq.heappop(self._heap)  # look under the top, then put it back
        second = self._clean_top()
        heapq.heappush(self._heap, first)
        heads = ((first[2], first[0]),)
        return heads if second is None else (*heads, (second[2], second[0]))

    def adopt(self, counters: Mapping[str, float], heads: PeerHeads) -> None:
        """Take the shared counters (plus what was journaled since), and the peers' heads."""
        pending = self.journal or Journal()
        for user, value in counters.items():
            state = self._users.get(user)
            if state is None:
                continue
            value = max(value, pending.floors.get(user, value)) + pending.deltas.get(user, 0.0)
            if value != state.counter:
                state.counter = value
                if state.active:
                    self._push(user, state)  # a new stamp retires the old heap entry
        self.peer_heads = heads

    def may_serve(self, user: str) -> bool:
        """Whether ``user`` is within the slack of anyone else's counter on the other replicas."""
        floor = self.peer_heads.floor(user)
        return floor is None or self.counter(user) <= floor + self.slack + 1e-9
