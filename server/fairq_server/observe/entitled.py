"""Each user's entitlement over the same decaying minute as its share of service.

The queue view compares a user's share of recent service (tokens decayed with the time
constant of :class:`~fairq_server.observe.recent.RecentService`, about a minute) with what the
fairness rule owes it. What the rule owes depends on who contends, which changes from one
moment to the next: comparing a minute's share with the entitlement of one moment made a
steady user's "over" mark come and go as others arrived and left. Here the entitlement is
taken over the same window, weighted the same way: at each reading, the tokens served since
the last one are credited to that interval's contenders in the parts the rule owes them then,
and those credits decay like the share. A user's windowed entitlement is its credits over all
credits, so shares and entitlements each sum to one over the same tokens.

Readings happen at the console's refreshes (while a page is open, or always in a cluster). A
first reading, or one after a gap longer than the window, has no history: it assumes the
moment's contenders held over the whole window (what the view showed before). The cost is one
pass over the interval's contenders per reading, what the view reads anyway.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = ["EntitledWindow"]


class EntitledWindow:
    """Credits of service owed per user, decayed with time constant ``tau`` seconds.

    Args:
        tau: the share's time constant (``RecentService.tau``).
        max_users: users remembered; past that the smallest credits are dropped.

    """

    def __init__(self, tau: float, max_users: int = 10_000) -> None:
        if tau <= 0 or max_users < 1:
            raise ValueError("tau must be > 0 and max_users >= 1")
        self.tau = tau
        self._max_users = max_users
        self._owed: dict[str, tuple[float, float]] = {}  # user -> (credit, updated at)
        self._sum = 0.0  # every credit, decayed to ``_at``
        self._at: float | None = None  # the last reading
        self._total = 0.0  # the service total at the last reading
        self._moment: dict[str, float] = {}  # the last reading's parts, as owed then

    def _decay(self, since: float, now: float) -> float:
        return math.exp(-max(0.0, now - since) / self.tau)

    def update(
        self,
        now: float,
        total: float,
        owed: Mapping[str, float],
        served: Mapping[str, float] | None = None,
    ) -> None:
        """Credit the service since the last reading to its contenders.

        Args:
            now: the reading's time (the service total's clock).
            total: every user's service now, decayed (``RecentService.total()``).
            owed: each contender's part now (summing to one; empty: nobody contends).
            served: the parts owed among the contenders now and the users served since the
                last reading (a request shorter than the readings' period is seen only by its
                tokens); None: ``owed``.

        """
        end = owed if served is None else served
        if self._at is None or now - self._at > self.tau:
            # No history: the moment's contenders are taken to have held over the window.
            self._owed = {user: (part * total, now) for user, part in owed.items()}
            self._sum = total if owed else 0.0
        else:
            decay = self._decay(self._at, now)
            tokens = max(0.0, total - self._total * decay)
            self._sum *= decay
            # The interval's contenders: the parts owed at its start and at its end, averaged
            # (a user who arrived or left in between is owed for about half of it).
            users = set(self._moment) | set(end)
            parts = {u: (self._moment.get(u, 0.0) + end.get(u, 0.0)) for u in users}
            norm = sum(parts.values())
            if tokens > 0 and norm > 0:
                for user, part in parts.items():
                    credit, updated = self._owed.get(user, (0.0, now))
                    self._owed[user] = (credit * self._decay(updated, now) + tokens * part / norm,
                                        now)  # fmt: skip
                self._sum += tokens
            if len(self._owed) > self._max_users:
                self._prune(now)
        self._at, self._total, self._moment = now, total, dict(owed)

    @property
    def last_reading(self) -> float | None:
        """The last reading's time (None: none yet)."""
        return self._at

    def entitled(self, user: str) -> float:
        """Return ``user``'s part of the service owed over the window (0-1).

        Without service in the window, the part owed at the last reading.
        """
        if self._at is None or self._sum <= 0:
            return self._moment.get(user, 0.0)
        credit, updated = self._owed.get(user, (0.0, self._at))
        return min(1.0, credit * self._decay(updated, self._at) / self._sum)

    def users(self) -> Iterable[str]:
        """Return the users holding a credit."""
        return self._owed.keys()

    def _prune(self, now: float) -> None:
        ranked = sorted(self._owed.items(), key=lambda kv: -kv[1][0] * self._decay(kv[1][1], now))
        self._owed = dict(ranked[: max(1, self._max_users // 2)])
