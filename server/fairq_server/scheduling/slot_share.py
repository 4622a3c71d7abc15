"""Slot shares: how many of a model's running slots each user and team is owed right now.

Where fairq knows a backend's slots (its ``max_in_flight``), a freed slot is a decision: who
runs next, for that request's whole generation. Counters alone (:mod:`.fairness`) choose among
the users queued at that instant, and a closed-loop caller (a chat app with one request in
flight, an agent with a few) is never queued at that instant: its next request arrives a
moment after its last one ended. So the dispatcher also looks at slots, shared max-min:

* each tier keeps, per user, what it has *outstanding* (queued or running) and its weight, and
  per team the same summed (:class:`Outstanding`);
* a unit (a team, or a user without one) is owed ``slots * weight / sum of the weights of the
  units with work outstanding``, and a team's user the team's share split by its users'
  weights: the weighted equal split, which is the max-min share of every unit that wants at
  least that much, while a unit wanting less leaves its part to be taken work-conservingly;
* a user is *below* its share while it and its team run fewer requests than they are owed,
  and *at* its share once it or its team runs as many as it is owed.

:mod:`.picking` serves a user below its share before one at its share, and
:mod:`.anticipation` holds a slot freed by a user below its share for that user's next
request. Everything here is O(1) per event.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EPSILON", "Outstanding"]

#: Share comparisons allow this much rounding.
EPSILON = 1e-9


@dataclass
class _Unit:
    """A team (or a user without one) with work outstanding in a tier."""

    weight: float  # the team's weight (a user's own, without a team)
    members: int = 0  # users of the unit with work outstanding
    member_weight: float = 0.0  # their weights summed (inside a team)
    running: int = 0  # requests of the unit running, less those finishing


@dataclass
class _User:
    unit: str  # its team's key, or its own name
    weight: float
    outstanding: int = 0  # queued + running
    running: int = 0  # of which this many are finishing (their slots counted free)
    finishing: int = 0


class Outstanding:
    """What each user and team of one tier has outstanding, for slot shares.

    The tier queue reports every request queued (:meth:`add`), started (:meth:`started`),
    ended (:meth:`stopped`) and removed without running (:meth:`dropped`).
    """

    def __init__(self) -> None:
        self._users: dict[str, _User] = {}
        self._units: dict[str, _Unit] = {}
        self._unit_weight = 0.0  # of every unit with work outstanding

    def add(self, user: str, weight: float, team: str | None, team_weight: float) -> None:
        """Count one more request of ``user`` outstanding (queued)."""
        state = self._users.get(user)
        if state is None:
            key = user if team is None else "\x1f" + team  # team names hold no 0x1F
            w = weight if weight > 0 else 1.0
            state = self._users[user] = _User(key, w)
            unit = self._units.get(key)
            if unit is None:
                unit_weight = w if team is None else (team_weight if team_weight > 0 else 1.0)
                unit = self._units[key] = _Unit(unit_weight)
                self._unit_weight += unit.weight
            unit.members += 1
            unit.member_weight += w
        state.outstanding += 1

    def started(self, user: str) -> None:
        """Count a queued request of ``user`` as running now (still outstanding)."""
        state = self._users.get(user)
        if state is not None:
            state.running += 1
            self._units[state.unit].running += 1

    def finishing(self, user: str) -> None:
        """Count a running request of ``user`` as about to end: its slot counts free already.

        From here on it no longer counts in the user's running requests (:mod:`.lookahead`).
        """
        state = self._users.get(user)
        if state is not None and state.running > state.finishing:
            state.finishing += 1
            self._units[state.unit].running -= 1

    def stopped(self, user: str, *, finishing: bool = False) -> None:
        """Count a running request of ``user`` as ended (back in the queue: :meth:`add` again).

        ``finishing``: it had been counted as :meth:`finishing`.
        """
        state = self._users.get(user)
        if state is None or state.running == 0:
            return
        state.running -= 1
        if finishing and state.finishing:
            state.finishing -= 1
        else:
            self._units[state.unit].running -= 1
        self._drop(user, state)

    def dropped(self, user: str) -> None:
        """Count a queued request of ``user`` as gone without running (cancelled, expired)."""
        state = self._users.get(user)
        if state is not None:
            self._drop(user, state)

    def _drop(self, user: str, state: _User) -> None:
        state.outstanding -= 1
        if state.outstanding > 0:
            return
        del self._users[user]
        unit = self._units[state.unit]
        unit.members -= 1
        unit.member_weight -= state.weight
        if unit.members == 0:
            del self._units[state.unit]
            self._unit_weight -= unit.weight
            if not self._units:
                self._unit_weight = 0.0  # no drift from float sums across bursts

    def running(self, user: str) -> int:
        """Return the requests of ``user`` running (finishing ones included)."""
        state = self._users.get(user)
        return state.running if state is not None else 0

    def _holding(self, state: _User) -> int:
        return state.running - state.finishing

    def owed(self, user: str, slots: int) -> tuple[float, float] | None:
        """Return ``(user's share, its unit's share)`` of ``slots`` (None: nothing outstanding)."""
        state = self._users.get(user)
        if state is None or self._unit_weight <= 0:
            return None
        unit = self._units[state.unit]
        unit_share = slots * unit.weight / self._unit_weight
        user_share = unit_share * state.weight / unit.member_weight
        return user_share, unit_share

    def below(
        self, user: str, slots: int, *, giving_back: int = 0, ending: str | None = None
    ) -> bool:
        """Whether ``user`` and its team run fewer requests than they are owed.

        ``giving_back``: count that many of the user's running requests as ended already.
        ``ending``: a user one of whose requests is ending: it counts as ended already for
        ``user``'s team if they share it (a team mate's slot is the team's to hand on).
        """
        state = self._users.get(user)
        owed = self.owed(user, slots)
        if state is None or owed is None:
            return False
        user_share, unit_share = owed
        unit = self._units[state.unit]
        freed = giving_back
        if ending is not None and ending != user:
            other = self._users.get(ending)
            freed += 1 if other is not None and other.unit == state.unit else 0
        return (
            self._holding(state) - giving_back < user_share - EPSILON
            and unit.running - freed < unit_share - EPSILON
        )

    def at_share(self, user: str, slots: int) -> bool:
        """Whether ``user`` or its team already runs as many requests as it is owed, or more.

        Such a user gives way to one below its share. Not "would be over if served": with
        fewer slots than users (shares below one) every user would be, and the counters, not
        the slots, must then take turns.
        """
        state = self._users.get(user)
        owed = self.owed(user, slots)
        if state is None or owed is None:
            return False
        user_share, unit_share = owed
        unit = self._units[state.unit]
        return self._holding(state) >= user_share - EPSILON or unit.running >= unit_share - EPSILON

    def __len__(self) -> int:
        return len(self._users)
