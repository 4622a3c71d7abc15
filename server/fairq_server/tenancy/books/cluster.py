"""The dispatcher's limit book in a cluster: decided in Redis, on the slot claim's round trip.

The dispatcher's loop never waits on Redis, so, as with the shared gate, a request is decided
in two steps:

1. at dispatch (:meth:`ClusterBook.reserve_now`, in the loop, no I/O) the request is granted
   provisionally, unless Redis refused one of its keys lately and that refusal's retry time
   has not passed (then it is refused at once, with that time);
2. the launcher sends the reservation to Redis in the same round trip as the request's slot
   claim (:meth:`ClusterBook.ride`, :meth:`ClusterBook.confirm`). If Redis refuses, the
   refusal is remembered and the launcher gives the request back to the dispatcher, whose next
   dispatch of it meets the remembered refusal in step 1: the request ends with the quota's
   error (``RESOURCE_EXHAUSTED`` / 429 and the retry time), as in one process.

Only what Redis granted is ever forwarded, so the bound is Redis's: limit plus one request's
amount per window, whatever the replica count. While Redis is unreachable the launcher
reserves from the one-process fallback on the local share
(:meth:`~fairq_server.tenancy.books.redis.RedisBook.reserve_local`).

``used_now`` (admission, the soft band, the team gauges) answers from the used amounts Redis
returned with this replica's own reservations: exact for a key this replica reserves on,
as of its last reservation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairq_server.tenancy.books.book import Grant, LimitKey, LimitUse, Refusal, Window
from fairq_server.tenancy.books.redis import RedisBook, ReserveReader, ScriptCall

__all__ = ["ClusterBook", "Ride"]


@dataclass(eq=False)
class _Pending:
    """A provisional grant: what Redis answered, and the actual amounts if settled first."""

    uses: tuple[LimitUse, ...]
    outcome: Grant | Refusal | None = None
    actual: Sequence[float] | None = None


@dataclass(eq=False)
class Ride:
    """A reservation riding on a slot claim: the call to send and where its reply goes."""

    pending: _Pending
    calls: list[ScriptCall]
    read: ReserveReader
    replies: list[Any] = field(default_factory=list)


def _pending_of(grant: Grant | None) -> _Pending | None:
    """Return the provisional grant inside ``grant`` (unwrapping books stacked over this)."""
    for _ in range(4):
        if grant is None:
            return None
        if isinstance(grant.token, _Pending):
            return grant.token
        inner = getattr(grant.token, "inner", None)
        grant = inner if isinstance(inner, Grant) else None
    return None


def _period(window: Window, now: float) -> int:
    """Return a number that changes with ``window``'s period (rolling: 0, checked by age)."""
    day = int(now // 86400)
    if window is Window.DAY:
        return day
    if window is Window.MONTH:
        tm = time.gmtime(now)
        return tm.tm_year * 12 + tm.tm_mon
    return 0


class ClusterBook:
    """A :class:`~fairq_server.tenancy.checker.SyncBook` over a :class:`RedisBook`.

    Args:
        shared: the Redis book every replica reserves in.
        spawn: runs a settlement in the background (the replica's, so that leaving the
            cluster waits for it); default: a task of the book's own (see :meth:`close`).

    """

    def __init__(
        self,
        shared: RedisBook,
        spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
    ) -> None:
        self.shared = shared
        self._spawn = spawn
        # key -> (used as Redis last said, when, its period then)
        self._known: dict[LimitKey, tuple[float, float, int]] = {}
        # key -> (wall time until which Redis's refusal holds, used then)
        self._refused: dict[LimitKey, tuple[float, float]] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- the dispatcher's loop (SyncBook) ---------------------------------------------------

    def reserve_now(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Grant provisionally, unless a refusal from Redis still holds for one of the keys."""
        for use in uses:
            refused = self._refused.get(use.key)
            if refused is not None:
                until, used_then = refused
                if now < until:
                    return Refusal(use, used_then, until - now)
                del self._refused[use.key]
        if all(use.amount == 0 for use in uses):  # a question, not a reservation
            return Grant(None, tuple(uses), tuple(self._used(u.key, now) for u in uses))
        pending = _Pending(tuple(uses))
        used = tuple(self._used(u.key, now) + u.amount for u in uses)
        return Grant(pending, tuple(uses), used)

    def settle_now(self, grant: Grant, actual: Sequence[float], now: float) -> None:
        """Settle in Redis (in the background), or when Redis's answer arrives."""
        pending = grant.token
        if not isinstance(pending, _Pending):
            return
        if pending.outcome is None:
            pending.actual = tuple(actual)  # confirm() settles it
        elif isinstance(pending.outcome, Grant):
            self._settle(pending.outcome, actual)

    def used_now(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """Each key's used amount as Redis last told this replica (0: not lately)."""
        return [self._used(key, now) for key in keys]

    # -- the launcher ----------------------------------------------------------------------

    def ride(self, grant: Grant | None) -> Ride | None:
        """Return the Redis call of a provisional grant, to send with the slot claim.

        The grant may be wrapped by a book over this one (the store's
        :class:`~fairq_server.tenancy.books.persisted.PersistedBook`: its token's ``inner``).
        """
        pending = _pending_of(grant)
        if pending is None:
            return None
        call, read = self.shared.reserve_call(pending.uses)
        return Ride(pending, [call], read)

    async def confirm(self, ride: Ride | None, now: float) -> bool:
        """Take Redis's answer (or reserve on the local share if none came); True: granted.

        Called once per ride, after the claim, whether or not the slot was granted.
        """
        if ride is None:
            return True
        pending = ride.pending
        if ride.replies:
            outcome = ride.read(ride.replies[0])
        else:  # Redis unreachable: the claim went nowhere
            outcome = await self.shared.reserve_local(pending.uses, now)
        pending.outcome = outcome
        if isinstance(outcome, Refusal):
            self._refused[outcome.use.key] = (now + outcome.retry_after, outcome.used)
            self._learn(outcome.use.key, outcome.used, now)
            return False
        for use, used in zip(outcome.uses, outcome.used, strict=True):
            self._learn(use.key, used, now)
        if pending.actual is not None:  # settled (aborted) while Redis was answering
            self._settle(outcome, pending.actual)
        return True

    async def close(self) -> None:
        """Wait for the settlements still on their way (bounded by the Redis timeouts)."""
        await asyncio.gather(*self._background, return_exceptions=True)

    # -- helpers ---------------------------------------------------------------------------

    def _learn(self, key: LimitKey, used: float, now: float) -> None:
        self._known[key] = (used, now, _period(key.window, now))

    def _used(self, key: LimitKey, now: float) -> float:
        known = self._known.get(key)
        if known is None:
            return 0.0
        used, at, period = known
        stale = (
            (now - at >= 60) if key.window is Window.MINUTE else period != _period(key.window, now)
        )
        if stale:
            del self._known[key]
            return 0.0
        return used

    def _settle(self, grant: Grant, actual: Sequence[float]) -> None:
        if self._spawn is not None:
            self._spawn(self.shared.settle(grant, actual))
            return
        task = asyncio.get_running_loop().create_task(self.shared.settle(grant, actual))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
