"""Hierarchical fairness: the configured policy between teams, then within each team.

Two levels of the same policy, composed rather than copied. The *team level* is one policy
instance whose entries are teams (weight: the team's weight) and users without a team (each
its own team; weight: the user's, as before teams existed). Inside a team, the *user level*
is another instance of the policy over the team's users (weight: the user's). A pick is the
team level's pick and, for a team, that team's pick; a charge goes to both levels.

Both levels keep their counters in the tier's one
:class:`~fairq_server.scheduling.interfaces.ServiceCounters`, so a cluster shares them the way
it shares users' counters. A team's entry is its name behind a tag (:data:`TEAM_TAG`) no user
name can start with (names never hold control characters), so a team and a user of the same
name never share a counter. A user without a team keeps its plain name at the team level: with
no team anywhere, the team level *is* the configured policy over users, entry for entry.

The peers' heads a cluster compares against are team-level (teams and users without one: the
same units); the user level never takes a floor from them (the user level's view hides it),
since a team member's counter only means something against its own team's. Members have heads
of their own, per team (:meth:`TeamFairness.member`): a member is served only while no member
of its team elsewhere is further behind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fairq_server.scheduling.counters import LocalCounters
from fairq_server.scheduling.interfaces import (
    Cost,
    FairnessPolicy,
    ServiceCounters,
    TracksRunning,
)

__all__ = ["TEAM_TAG", "TeamFairness", "team_key"]

#: Prefix of a team's entry at the team level (and of its shared counter's name).
TEAM_TAG = "\x1fteam\x1f"


def team_key(team: str) -> str:
    """Return the team level's entry (and counter name) of ``team``."""
    return TEAM_TAG + team


class _WithinTeam:
    """A team's user level: the tier's counters under the team's names, and no peer floor.

    A member's counter is named by its team's key, a unit separator (0x1F) and the user, so
    the same user in two teams (or without one) never shares a counter. The peers' heads are
    team-level counters: a member lifted to one would be lifted to a number in other units,
    so :meth:`floor` is None.
    """

    def __init__(self, counters: ServiceCounters, key: str) -> None:
        self._counters = counters
        self.prefix = key + "\x1f"
        self.changed: Callable[[str], None] = lambda user: None

    @property
    def shared(self) -> bool:
        return self._counters.shared

    def get(self, user: str) -> float | None:
        return self._counters.get(self.prefix + user)

    def lift(self, user: str, floor: float) -> None:
        self._counters.lift(self.prefix + user, floor)

    def add(self, user: str, amount: float) -> None:
        self._counters.add(self.prefix + user, amount)

    def forget(self, user: str) -> None:
        self._counters.forget(self.prefix + user)

    def floor(self, user: str) -> float | None:
        return None

    def watch(self, changed: Callable[[str], None]) -> None:
        # One watcher on the tier's counters serves every team (see TeamFairness._changed).
        self.changed = changed


@dataclass
class _Team:
    view: _WithinTeam
    policy: FairnessPolicy
    active: int = 0  # backlogged users
    running: int = 0  # requests of its users running


def _started(policy: FairnessPolicy, name: str) -> None:
    if isinstance(policy, TracksRunning):
        policy.started(name)


def _stopped(policy: FairnessPolicy, name: str) -> None:
    if isinstance(policy, TracksRunning):
        policy.stopped(name)


class TeamFairness:
    """The configured policy between teams, and again between each team's users.

    Implements :class:`~fairq_server.scheduling.interfaces.FairnessPolicy`: called as such
    (no team given) every user is its own team, and the result is the configured policy's.
    The tier queue gives a request's team with :meth:`activate_in` and :meth:`charge_in`.

    Args:
        make: builds one level's policy on the given counters (the configured policy).
        counters: the tier's counters (None: a table of its own).

    """

    def __init__(
        self,
        make: Callable[[ServiceCounters], FairnessPolicy],
        counters: ServiceCounters | None = None,
    ) -> None:
        self._counters: ServiceCounters = counters if counters is not None else LocalCounters()
        self._make = make
        self._top = make(self._counters)
        self._counters.watch(self._changed)
        self._teams: dict[str, _Team] = {}  # by team key
        self._active: dict[str, str] = {}  # backlogged user -> its team-level entry
        self._queue_side: LocalCounters | None = None

    def _changed(self, name: str) -> None:
        # A cluster sync changed a counter: a team member's goes to its team's user level.
        if name.startswith(TEAM_TAG):
            # Team names hold no control character; a user name may.
            team, sep, user = name[len(TEAM_TAG) :].partition("\x1f")
            entry = self._teams.get(team_key(team)) if sep else None
            if entry is not None:
                entry.view.changed(user)

    def report_to(self, counters: LocalCounters) -> None:
        """Tell ``counters`` (the tier queue's side) which team-level entries are backlogged.

        A cluster's heads are of the team level; a team member's own counter is read back
        from the cluster as well (:meth:`LocalCounters.tracked`).
        """
        self._queue_side = counters

    def members(self, entry: str) -> list[str]:
        """Return the backlogged users behind team-level ``entry`` (itself, for a user)."""
        return [user for user, key in self._active.items() if key == entry]

    def level_key(self, user: str) -> str:
        """Return ``user``'s team-level entry: its team's key, or itself (no team)."""
        return self._active.get(user, user)

    def team_picks(self, limit: int) -> list[str]:
        """Return each of the first ``limit`` team-level entries' pick, in team-level order."""
        out = []
        for key in self._top.candidates(math.inf, limit):
            entry = self._teams.get(key)
            out.append(key if entry is None else entry.policy.select())
        return out

    def member(self, user: str) -> tuple[str, str] | None:
        """Return backlogged ``user``'s member counter and its team's key (None: no team)."""
        key = self._active.get(user)
        if key is None or key == user:
            return None
        return self._teams[key].view.prefix + user, key

    # -- FairnessPolicy -------------------------------------------------------------------

    def activate(self, user: str, weight: float, *, resume: bool = False) -> None:
        """See :meth:`FairnessPolicy.activate` (``user`` is its own team)."""
        self.activate_in(user, weight, None, 1.0, resume=resume)

    def _team(self, key: str) -> _Team:
        entry = self._teams.get(key)
        if entry is None:
            view = _WithinTeam(self._counters, key)
            entry = self._teams[key] = _Team(view, self._make(view))
        return entry

    def report_held(self, user: str, team: str | None, held: bool) -> None:
        """Report ``user`` (of ``team``) to the counters as backlogged while a slot is held for it.

        A cluster's other replicas then see it among the heads, as if its next request were
        queued already (:mod:`..anticipation`). A user backlogged anyway is left alone.
        """
        side = self._queue_side
        if side is None or user in self._active:
            return
        if team is None:
            side.backlogged(user, held)
            return
        key = team_key(team)
        entry = self._teams.get(key)
        side.tracked(key + "\x1f" + user, held, key)
        if entry is None or entry.active == 0:
            side.backlogged(key, held)

    def started(self, user: str) -> None:
        """See :class:`TracksRunning` (``user`` is its own team)."""
        self.started_in(user, None)

    def stopped(self, user: str) -> None:
        """See :class:`TracksRunning` (``user`` is its own team)."""
        self.stopped_in(user, None)

    def started_in(self, user: str, team: str | None) -> None:
        """Note that a request of ``user`` of ``team`` was dispatched (see :class:`TracksRunning`).

        Both levels hear it: the team is not idle while any of its users runs something.
        """
        if team is None:
            _started(self._top, user)
            return
        key = team_key(team)
        entry = self._team(key)
        entry.running += 1
        _started(entry.policy, user)
        _started(self._top, key)

    def stopped_in(self, user: str, team: str | None) -> None:
        """Note that a request of ``user`` of ``team`` ended or went back to the queue."""
        if team is None:
            _stopped(self._top, user)
            return
        key = team_key(team)
        entry = self._teams.get(key)
        if entry is None or entry.running == 0:
            return  # counted before a rebuild: nothing to undo
        entry.running -= 1
        _stopped(entry.policy, user)
        _stopped(self._top, key)
        if entry.running == 0 and entry.active == 0 and not self._counters.shared:
            del self._teams[key]  # idle on one process: see deactivate()

    def activate_in(
        self, user: str, weight: float, team: str | None, team_weight: float, *,
        resume: bool = False,
    ) -> None:  # fmt: skip
        """Mark ``user`` of ``team`` (None: no team) backlogged; ``team_weight`` is its weight.

        A user keeps the team it became backlogged in until its queue empties.
        """
        if user in self._active:
            return
        side = self._queue_side
        if team is None:
            self._active[user] = user
            self._top.activate(user, weight, resume=resume)
            if side is not None:
                side.backlogged(user, True)
            return
        key = team_key(team)
        entry = self._team(key)
        self._active[user] = key
        entry.active += 1
        entry.policy.activate(user, weight, resume=resume)
        if side is not None:
            side.tracked(entry.view.prefix + user, True, key)
        if entry.active == 1:
            self._top.activate(key, team_weight, resume=resume)
            if side is not None:
                side.backlogged(key, True)

    def deactivate(self, user: str) -> None:
        """See :meth:`FairnessPolicy.deactivate`."""
        key = self._active.pop(user, None)
        if key is None:
            return
        side = self._queue_side
        if key == user:
            self._top.deactivate(user)
            if side is not None:
                side.backlogged(user, False)
            return
        entry = self._teams[key]
        entry.policy.deactivate(user)
        entry.active -= 1
        if side is not None:
            side.tracked(entry.view.prefix + user, False, key)
        if entry.active == 0:
            self._top.deactivate(key)
            if side is not None:
                side.backlogged(key, False)
            if not self._counters.shared and entry.running == 0:
                # One process: the user level forgot its users when the last went idle (see
                # CounterFairness.deactivate); the team level keeps the team's standing. In a
                # cluster the user level is kept: its idle users are still charged elsewhere.
                # While its users run requests the team is not idle: kept until they end.
                del self._teams[key]

    def select(self) -> str:
        """See :meth:`FairnessPolicy.select`: the team level's pick, then the team's."""
        key = self._top.select()
        entry = self._teams.get(key)
        return key if entry is None else entry.policy.select()

    def candidates(self, quantum: float, limit: int) -> list[str]:
        """See :meth:`FairnessPolicy.candidates`: each team's users within ``quantum``, in turn.

        ``quantum`` applies at each level in that level's units; the first user is
        :meth:`select`'s.
        """
        out: list[str] = []
        for key in self._top.candidates(quantum, limit):
            entry = self._teams.get(key)
            if entry is None:
                out.append(key)
            else:
                out += entry.policy.candidates(quantum, limit - len(out))
            if len(out) >= limit:
                break
        return out

    def charge(self, user: str, cost: Cost, weight: float | None = None) -> None:
        """See :meth:`FairnessPolicy.charge` (a user not backlogged in a team: no team)."""
        self.charge_in(user, cost, weight, None, 1.0)

    def charge_in(
        self, user: str, cost: Cost, weight: float | None, team: str | None, team_weight: float
    ) -> None:
        """Charge ``cost`` to ``user`` and to its team (the one it is backlogged in, if it is).

        ``weight`` and ``team_weight`` are the request's (a reload may have changed them
        since the team became backlogged: the charge takes the current ones).
        """
        key = self._active.get(user)
        if key is None:
            key = user if team is None else team_key(team)
        if key == user:
            self._top.charge(user, cost, weight)
            return
        self._top.charge(key, cost, team_weight)
        entry = self._teams.get(key)
        if entry is not None:
            entry.policy.charge(user, cost, weight)
        # else: the team went idle here, on one process: nobody to be fair against inside
        # it until it comes back (the user level starts afresh then).
