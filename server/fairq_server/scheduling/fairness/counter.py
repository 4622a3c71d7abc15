"""Shared machinery of the counter-based fairness policies.

Each policy keeps a service counter per user and serves the backlogged user with the smallest
counter; they differ in what they charge (see :mod:`.round_robin`, :mod:`.vtc`). The counters
live in a heap with lazy updates: a charge raises a counter, so a heap entry whose key is lower
than its user's current counter is simply re-pushed when it surfaces. What lowers a counter (a
refund, a cluster's sync) re-pushes the user at once: an entry above its counter would keep a
user that is furthest behind from ever surfacing. Every operation is O(log n) amortised.

A user who becomes backlogged with nothing outstanding (nothing queued and nothing running) is
lifted to the smallest counter among backlogged users (or, with none backlogged, to the counter
of the last user served): idle time cannot be banked as credit and spent later in a burst
(Sheng et al., OSDI 2024). A user with requests running is not idle: a closed-loop caller
(a chat app, an agent) whose queue empties each time its request is dispatched, and refills a
moment after it ends, keeps its counter, and with it whatever standing it has built. The queue
says which users run something (:meth:`CounterFairness.started`, :meth:`CounterFairness.stopped`);
their records are kept while they do.

The counters themselves live in the tier's :class:`~fairq_server.scheduling.interfaces.
ServiceCounters` (given at construction; a local table if none): in a cluster they are shared
with the other replicas (:mod:`fairq_server.scheduling.counters`), which change them between
picks (the policy re-orders what changed) and supply the floor of users backlogged elsewhere
for the lift. This module knows nothing else of the cluster.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from fairq_server.scheduling.counters import LocalCounters
from fairq_server.scheduling.interfaces import Cost, ServiceCounters

__all__ = ["CounterFairness"]

_FRESH = 1 << 62


@dataclass
class _UserState:
    weight: float = 1.0
    active: bool = False
    stamp: int = -1  # the stamp of this user's one valid heap entry
    running: int = 0  # requests dispatched and not ended: the user is not idle


class CounterFairness:
    """Shared machinery: serve the active user with the smallest counter.

    Ties go to the user whose entry was pushed first, which makes equal counters rotate in
    round-robin order. A user lifted on becoming backlogged goes before users who reached
    that counter by being served: it joins the rotation next, as in round-robin, instead of
    after one more turn of everyone already there (a user that was not lifted had its turn
    at this counter and queues behind as usual). Subclasses decide what a :class:`Cost` is
    worth (:meth:`price`).

    Args:
        counters: where the users' counters live (None: a table of its own).
        lift: lift a user who becomes backlogged to the smallest active counter (the default,
            and the only fair choice). ``lift=False`` keeps whatever counter the user had (0
            for a new one) and never forgets an idle user, so idle time is banked as credit:
            a baseline for benchmarks that show what the lift prevents.

    """

    def __init__(self, counters: ServiceCounters | None = None, *, lift: bool = True) -> None:
        self._counters: ServiceCounters = counters if counters is not None else LocalCounters()
        self._counters.watch(self._changed)
        self._get = self._counters.get  # read on every heap check: one lookup, not two
        self._lift = lift
        self._users: dict[str, _UserState] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._next_stamp = 0  # an int, not itertools.count: policies are deep-copied
        self._virtual_time = 0.0
        self._active = 0
        self._running = 0  # users with requests running
        # Idle users whose counter was above the virtual time when they went idle: forgotten
        # once the virtual time passes them (a returning user is lifted that far anyway), so
        # memory follows active users, not every user name ever seen.
        self._idle: list[tuple[float, str]] = []

    def _value(self, user: str) -> float:
        value = self._get(user)
        return self._virtual_time if value is None else value

    def _changed(self, user: str) -> None:
        state = self._users.get(user)
        if state is not None and state.active:
            self._push(user, state)  # a new stamp retires the old heap entry

    def _push(self, user: str, state: _UserState, *, fresh: bool = False) -> None:
        # Activation stamps sort before every stamp given after a charge, in arrival order.
        state.stamp = self._next_stamp - (_FRESH if fresh else 0)
        self._next_stamp += 1
        heapq.heappush(self._heap, (self._value(user), state.stamp, user))

    def _clean_top(self) -> tuple[float, int, str] | None:
        """Drop dead entries and refresh stale ones until the top is exact."""
        heap = self._heap
        while heap:
            counter, stamp, user = heap[0]
            state = self._users.get(user)
            if state is None or not state.active or stamp != state.stamp:
                heapq.heappop(heap)
            elif counter < (self._get(user) or 0.0):  # charged since it was pushed
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
            state = self._users[user] = _UserState()
            self._counters.lift(user, self._virtual_time if self._lift else 0.0)
        if state.active:
            return
        state.weight = weight if weight > 0 else 1.0
        if not self._lift or resume or state.running:
            # Resumed: a lift would take away the standing a refused dispatch just gave back,
            # and with refusals at random, users' service would drift apart. Running: the user
            # was never idle, only between requests (a closed loop's next request arrives a
            # moment after its last one ended); a lift would erase the standing it built.
            state.active = True
            self._active += 1
            self._push(user, state)
            return
        top = self._clean_top()
        floor = top[0] if top is not None else self._virtual_time
        peer_floor = self._counters.floor(user)
        if peer_floor is not None:
            # The smallest counter backlogged on the other replicas (as last read).
            floor = peer_floor if top is None else min(floor, peer_floor)
        lifted = self._value(user) < floor
        self._counters.lift(user, floor)
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
        self._settle_idle(user, state)

    def started(self, user: str) -> None:
        """Note that a request of ``user`` was dispatched (it runs until :meth:`stopped`).

        Called before the queue reports the user idle, so its record is never forgotten
        between its request leaving the queue and starting.
        """
        state = self._users.get(user)
        if state is None:
            state = self._users[user] = _UserState()
            self._counters.lift(user, self._virtual_time if self._lift else 0.0)
        state.running += 1
        if state.running == 1:
            self._running += 1

    def stopped(self, user: str) -> None:
        """Note that a request of ``user`` ended (or went back to the queue)."""
        state = self._users.get(user)
        if state is None or state.running == 0:
            return  # counted before a rebuild or a drop of the history: nothing to undo
        state.running -= 1
        if state.running:
            return
        self._running -= 1
        if not state.active and self._lift:
            self._settle_idle(user, state)

    def _settle_idle(self, user: str, state: _UserState) -> None:
        """Forget or park ``user``, who has nothing queued; or drop all history."""
        if self._active == 0 and self._running == 0 and not self._counters.shared:
            # Nobody is backlogged or running: counters only matter relative to those who
            # are, so the history can go. Everyone who comes back is lifted to the highest
            # counter seen, which takes credit away from no one and keeps memory at zero
            # between bursts. Not in a cluster: users are backlogged on the other replicas,
            # and a user whose requests are all in flight here is still being charged.
            # Dropped, it would come back at the old counter (the charges since only
            # journaled), be served at once as if behind, until the next sync; kept, it is
            # parked like any idle user.
            self._virtual_time = max(self._virtual_time, *map(self._value, self._users))
            for name in self._users:
                self._counters.forget(name)
            self._users.clear()
            self._idle.clear()
            return
        if state.running:
            return  # not idle: its record stays until its last request ends
        self._forget_or_park(user, state)

    def _forget_or_park(self, user: str, state: _UserState) -> None:
        # Keep an idle record only while it carries a counter above the floor a returning
        # user would get anyway. Charges arriving later carry their own weight.
        value = self._value(user)
        if value <= self._virtual_time:
            del self._users[user]
            self._counters.forget(user)
        else:
            heapq.heappush(self._idle, (value, user))

    def _prune(self) -> None:
        idle = self._idle
        while idle and idle[0][0] <= self._virtual_time:
            _, user = heapq.heappop(idle)
            state = self._users.get(user)
            if state is not None and not state.active and not state.running:
                # A running user left the idle list here; stopped() settles it at its end.
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
        """Return ``user``'s service counter (the virtual time for a user without a record)."""
        return self._value(user) if user in self._users else self._virtual_time

    def min_counter(self) -> float:
        """Return the smallest counter among active users (0 when none is active)."""
        top = self._clean_top()
        return top[0] if top is not None else 0.0

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        """See :meth:`FairnessPolicy.charge`."""
        self._add(user, self.price(cost), weight)

    def _add(self, user: str, amount: float, weight: float | None = None) -> None:
        if not amount:
            return
        state = self._users.get(user)
        w = weight if weight is not None and weight > 0 else state.weight if state else 1.0
        if state is None and self._active:
            state = self._users[user] = _UserState()
            self._counters.lift(user, self._virtual_time)
            # Created for an idle user by a late charge: make it prunable like the others.
            heapq.heappush(self._idle, (self._virtual_time, user))
        # Without a record (nobody to be fair against here: see deactivate()) only a cluster
        # keeps the charge: the user may be backlogged elsewhere.
        self._counters.add(user, amount / w)
        if amount < 0 and state is not None and state.active:
            # A refund (a refused dispatch) lowers the counter: the heap entry above it must
            # go now, or this user sorts behind users it is ahead of (and, in a cluster, its
            # replica serves nobody while another replica waits for it).
            self._push(user, state)

    def price(self, cost: Cost) -> float:
        """Return what ``cost`` adds to a counter before the weight divides it."""
        raise NotImplementedError
