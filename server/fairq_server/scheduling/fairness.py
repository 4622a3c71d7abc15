"""Fairness between users inside one tier.

Both policies keep a service counter per user and serve the backlogged user with the smallest
counter; they differ in what they charge. The counters live in a heap with lazy updates:
charges only ever raise a counter, so a heap entry whose key is lower than its user's current
counter is simply re-pushed when it surfaces. Every operation is O(log n) amortised.

A user whose queue goes from empty to non-empty is lifted to the smallest counter among
backlogged users (or, with none backlogged, to the counter of the last user served): idle time
cannot be banked as credit and spent later in a burst (Sheng et al., OSDI 2024).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from fairq_server.scheduling.ticket import Ticket

__all__ = ["CounterFairness", "RoundRobinFairness", "VtcFairness"]

_FRESH = 1 << 62


@dataclass
class _UserState:
    counter: float = 0.0
    weight: float = 1.0
    active: bool = False
    stamp: int = -1  # the stamp of this user's one valid heap entry


class CounterFairness:
    """Shared machinery: serve the active user with the smallest counter.

    Ties go to the user whose entry was pushed first, which makes equal counters rotate in
    round-robin order. A user lifted on becoming backlogged goes before users who reached
    that counter by being served: it joins the rotation next, as in round-robin, instead of
    after one more turn of everyone already there (a user that was not lifted had its turn
    at this counter and queues behind as usual). Subclasses decide what a dispatch and a
    token cost.
    """

    def __init__(self) -> None:
        self._users: dict[str, _UserState] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._stamps = itertools.count()
        self._virtual_time = 0.0
        self._active = 0
        # Idle users whose counter was above the virtual time when they went idle: forgotten
        # once the virtual time passes them (a returning user is lifted that far anyway), so
        # memory follows active users, not every user name ever seen.
        self._idle: list[tuple[float, str]] = []

    def _push(self, user: str, state: _UserState, *, fresh: bool = False) -> None:
        # Activation stamps sort before every stamp given after a charge, in arrival order.
        state.stamp = next(self._stamps) - (_FRESH if fresh else 0)
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

    def activate(self, user: str, weight: float) -> None:
        """See :meth:`FairnessPolicy.activate`."""
        state = self._users.get(user)
        if state is None:
            # New, or forgotten at a counter <= the virtual time: it starts there, so a user
            # served moments ago and forgotten is not mistaken for one that was never served.
            state = self._users[user] = _UserState(counter=self._virtual_time)
        if state.active:
            return
        state.weight = weight if weight > 0 else 1.0
        top = self._clean_top()
        floor = top[0] if top is not None else self._virtual_time
        lifted = state.counter < floor
        state.counter = max(state.counter, floor)
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
        if self._active == 0:
            # Nobody is backlogged: counters only matter relative to backlogged users, so the
            # history can go. Everyone who comes back is lifted to the highest counter seen,
            # which takes credit away from no one and keeps memory at zero between bursts.
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

    def _charge(self, user: str, amount: float, weight: float | None = None) -> None:
        state = self._users.get(user)
        if state is None:
            if self._active == 0:
                return  # nobody to be fair against: see deactivate()
            state = self._users[user] = _UserState(counter=self._virtual_time)
            # Created for an idle user by a late charge: make it prunable like the others.
            heapq.heappush(self._idle, (state.counter, user))
        w = weight if weight is not None and weight > 0 else state.weight
        state.counter += amount / w

    def charge_dispatch(self, ticket: Ticket) -> None:
        """See :meth:`FairnessPolicy.charge_dispatch`. Charges nothing by default."""

    def charge_tokens(
        self, user: str, prompt_tokens: int, completion_tokens: int, weight: float | None = None
    ) -> None:
        """See :meth:`FairnessPolicy.charge_tokens`. Charges nothing by default."""


class RoundRobinFairness(CounterFairness):
    """One request per backlogged user per turn (the counter counts requests)."""

    def charge_dispatch(self, ticket: Ticket) -> None:
        """Charge one unit per dispatched request, regardless of weight."""
        self._charge(ticket.user, 1.0, weight=1.0)


class VtcFairness(CounterFairness):
    """Virtual token counters: charge ``(input + 2 * output) / weight`` as tokens stream.

    Output tokens weigh double because decoding a token costs a backend more than prefilling
    one; the factor follows the VTC paper's default cost function.
    """

    OUTPUT_WEIGHT = 2.0

    def charge_dispatch(self, ticket: Ticket) -> None:
        """Charge the (estimated) prompt on admission, as VTC does.

        Without it, one dispatch pass would hand every free slot to the same user, since no
        token has been counted yet; the servicer settles the estimate against the backend's
        own count when the request ends.
        """
        self._charge(ticket.user, float(ticket.prompt_tokens), ticket.weight)

    def charge_tokens(
        self, user: str, prompt_tokens: int, completion_tokens: int, weight: float | None = None
    ) -> None:
        """Charge processed tokens to ``user``'s counter, divided by the request's weight."""
        self._charge(user, prompt_tokens + self.OUTPUT_WEIGHT * completion_tokens, weight)
