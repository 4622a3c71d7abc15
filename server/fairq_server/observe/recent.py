"""Recent service per user: tokens served, decayed exponentially, for operators' views.

``fairq top`` and the ``GetQueueSnapshot`` RPC show who has been served lately beside who is
queued. The fairness policies keep their own counters, shaped by the policy (round-robin
counts dispatches, vtc weighted tokens) and reset when a policy is reloaded; this is the plain
measure an operator expects ("tokens in about the last minute"), kept apart from scheduling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["RecentService"]


class RecentService:
    """Per-user token totals that decay with time constant ``tau`` seconds.

    A user served at a steady ``r`` tokens a second reads about ``r * tau``. At most
    ``max_users`` users are kept: past that, the smallest totals are dropped (a name is then
    missing from the view, never wrong about the others). Each user's value is stored with the
    time it was last updated and decayed when read, so recording is O(1).
    """

    def __init__(
        self,
        tau: float = 60.0,
        max_users: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if tau <= 0 or max_users < 1:
            raise ValueError("tau must be > 0 and max_users >= 1")
        self.tau = tau
        self._max_users = max_users
        self._clock = clock
        self.clock = clock
        self._users: dict[str, tuple[float, float]] = {}  # user -> (value, updated at)
        # Every token, pruned users' too: the denominator a windowed average divides by.
        self._total: tuple[float, float] = (0.0, clock())

    def __len__(self) -> int:
        return len(self._users)

    def _decayed(self, value: float, updated: float, now: float) -> float:
        return value * math.exp(-(now - updated) / self.tau)

    def record(self, user: str, tokens: int) -> None:
        """Add ``tokens`` served to ``user`` now."""
        if tokens <= 0:
            return
        now = self._clock()
        value, updated = self._users.get(user, (0.0, now))
        self._users[user] = (self._decayed(value, updated, now) + tokens, now)
        total, since = self._total
        self._total = (self._decayed(total, since, now) + tokens, now)
        if len(self._users) > self._max_users:
            self._prune(now)

    def _prune(self, now: float) -> None:
        """Keep the larger half of ``max_users``, so pruning runs once per many records."""
        ranked = sorted(self._users.items(), key=lambda kv: -self._decayed(kv[1][0], kv[1][1], now))
        self._users = dict(ranked[: max(1, self._max_users // 2)])

    def total(self) -> float:
        """Return every user's tokens together, decayed alike (pruned users' included)."""
        total, since = self._total
        return self._decayed(total, since, self._clock())

    def recorded_since(self, moment: float) -> list[str]:
        """Return the users served at or after ``moment`` (on this object's clock)."""
        return [user for user, (_, updated) in self._users.items() if updated >= moment]

    def values(self) -> dict[str, float]:
        """Return every user's decayed total now, forgetting those below half a token."""
        now = self._clock()
        out = {}
        for user, (value, updated) in list(self._users.items()):
            current = self._decayed(value, updated, now)
            if current < 0.5:
                del self._users[user]
            else:
                out[user] = current
        return out
