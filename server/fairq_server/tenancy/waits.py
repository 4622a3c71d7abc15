"""Queue waits and times to first token per user and per team, summed between two samples.

The console's trends (:class:`~fairq_server.observe.history.LiveHistory`) show the mean wait
and time to first token of each interval per tier, from the metrics' histograms; per user and
per team there is no metric (a label per user would grow ``/metrics`` without bound), so the
requests' path adds each figure here and every sample takes the sums and starts again.

Cheap on the request's path: one dictionary lookup and two additions per figure. Bounded: at
most :data:`MAX_TRACKED` users and as many teams are told apart within one interval; the
figures of any further one go to a single "others" sum, so the memory held does not depend on
how many users call between two samples (or whether anyone samples at all).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MAX_TRACKED", "Interval", "Sums", "WaitTally"]

#: Users (and, apart, teams) told apart between two samples; the rest are summed together.
MAX_TRACKED = 512


@dataclass
class Sums:
    """One subject's figures over an interval.

    Attributes:
        wait: queue waits summed (seconds), of ``waits`` requests dispatched.
        waits: requests dispatched.
        ttft: times to first token summed (seconds), of ``firsts`` requests.
        firsts: requests that had their first token.

    """

    wait: float = 0.0
    waits: int = 0
    ttft: float = 0.0
    firsts: int = 0

    @property
    def weight(self) -> float:
        """Seconds spent waiting, queue and first token together: what ranks the subjects."""
        return self.wait + self.ttft

    def add(self, other: Sums) -> None:
        """Add ``other``'s figures to these."""
        self.wait += other.wait
        self.waits += other.waits
        self.ttft += other.ttft
        self.firsts += other.firsts


@dataclass
class Interval:
    """The sums of one interval: per user, per team (None: no team), and the untracked rest.

    Attributes:
        users: per user told apart.
        teams: per team told apart.
        other_users: every user past :data:`MAX_TRACKED`, together.
        other_teams: every team past :data:`MAX_TRACKED`, together.

    """

    users: dict[str, Sums] = field(default_factory=dict)
    teams: dict[str | None, Sums] = field(default_factory=dict)
    other_users: Sums = field(default_factory=Sums)
    other_teams: Sums = field(default_factory=Sums)


class WaitTally:
    """Per user and per team waits and times to first token since the last :meth:`take`.

    Args:
        tracked: users (and teams) told apart per interval.

    """

    def __init__(self, tracked: int = MAX_TRACKED) -> None:
        self._tracked = max(1, tracked)
        self._now = Interval()

    def waited(self, user: str, team: str | None, seconds: float) -> None:
        """Count a request of ``user`` (of ``team``) dispatched after ``seconds`` queued."""
        for sums in self._sums(user, team):
            sums.wait += seconds
            sums.waits += 1

    def first_token(self, user: str, team: str | None, seconds: float) -> None:
        """Count a request of ``user`` (of ``team``) whose first token came ``seconds`` in."""
        for sums in self._sums(user, team):
            sums.ttft += seconds
            sums.firsts += 1

    def take(self) -> Interval:
        """Return the sums since the last call and start again."""
        taken, self._now = self._now, Interval()
        return taken

    def _sums(self, user: str, team: str | None) -> tuple[Sums, Sums]:
        now = self._now
        by_user = now.users.get(user)
        if by_user is None:
            if len(now.users) < self._tracked:
                by_user = now.users[user] = Sums()
            else:
                by_user = now.other_users
        by_team = now.teams.get(team)
        if by_team is None:
            if len(now.teams) < self._tracked:
                by_team = now.teams[team] = Sums()
            else:
                by_team = now.other_teams
        return by_user, by_team
