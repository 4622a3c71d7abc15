"""A replica's fairness sync: its counter journals to Redis, the shared counters back.

One background task (never the dispatcher loop) takes every tier's counter journal from the
dispatcher (:class:`~fairq_server.scheduling.events.TakeJournals`), flushes it with
:class:`~.fairness.SharedCounters` and posts the shared counters and the other replicas'
heads back (:class:`~fairq_server.scheduling.events.FairnessSync`). It runs after a dispatch
here, when another replica announces that its heads moved, and every third of a lease (which
keeps this replica's heads alive); a burst of wake-ups shares one sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Callable

import redis.asyncio as aioredis

from fairq_server.cluster.connection import REDIS_ERRORS
from fairq_server.cluster.fairness import SharedCounters
from fairq_server.runtime.supervisor import stop_asked
from fairq_server.scheduling import events as ev
from fairq_server.scheduling.counters import Heads, MemberHeads, PeerHeads

__all__ = ["COALESCE_SECONDS", "FairSync"]

log = logging.getLogger(__name__)

#: Shortest time between two reads of the shared gate, and between two fairness syncs:
#: at a high request rate each read or sync covers many events (the cost per request falls)
#: at the price of this much delay in learning another replica's news.
COALESCE_SECONDS = 0.005


class FairSync:
    """The fairness sync task of one replica.

    Args:
        client: the replica's Redis client (to announce moved heads).
        replica_id: this replica's id (the announcement).
        counters: the Redis side of shared fairness.
        every: longest time between two syncs (renews this replica's heads).
        connected: whether the replica is on the shared gate (else: local fairness).
        lost: called with a Redis error.

    """

    def __init__(
        self,
        client: aioredis.Redis,
        replica_id: str,
        counters: SharedCounters,
        every: float,
        connected: Callable[[], bool],
        lost: Callable[[BaseException], None],
    ) -> None:
        self.post: Callable[[ev.Event], None] = lambda event: None
        self._client = client
        self._replica_id = replica_id
        self._counters = counters
        self._every = every
        self._connected = connected
        self._lost = lost
        self._wake = asyncio.Event()
        # The heads (users', members') last stored per model and tier.
        self._heads: dict[tuple[str, int], tuple[Heads, MemberHeads]] = {}

    def wake(self) -> None:
        """Sync soon (a dispatch or a newly backlogged user here, or heads moved elsewhere)."""
        self._wake.set()

    async def run(self) -> None:
        """Sync whenever woken, and at least every ``every`` seconds, until cancelled."""
        while not stop_asked():
            # Every change is announced (a dispatch here, a head moved elsewhere); the timer
            # only renews this replica's heads, whose lease is a whole lease.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._every):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._sync()
            except REDIS_ERRORS as exc:
                self._lost(exc)
            except Exception:
                log.exception("fairness sync failed")
            # A burst of dispatches shares one sync: at most one per COALESCE.
            await asyncio.sleep(COALESCE_SECONDS)

    async def _take(self) -> list[ev.JournalEntry]:
        done: asyncio.Future[list[ev.JournalEntry]] = asyncio.get_running_loop().create_future()
        self.post(ev.TakeJournals(done))
        return await done

    async def _sync(self) -> None:
        entries = await self._take()
        if not self._connected():
            # Local fairness until Redis is back: no floor from replicas not heard from.
            for e in entries:
                if self._heads.pop((e.model, e.tier), None) is not None:
                    self.post(ev.FairnessSync(e.model, e.tier, {}, PeerHeads()))
            return
        results = await self._counters.sync(entries)
        moved = stale = False
        for e, r in zip(entries, results, strict=True):
            self.post(ev.FairnessSync(r.model, r.tier, r.counters, r.heads))
            stored = (e.heads, e.members)
            moved |= self._heads.get((e.model, e.tier)) != stored
            self._heads[(e.model, e.tier)] = stored
            # Another replica charged a user at the head here: the heads just stored are
            # behind the counters adopted now, and would hold others back; store them again.
            heads = itertools.chain(e.heads, ((name, c) for _, name, c in e.members))
            stale |= any(
                not math.isclose(r.counters.get(user, c), c, rel_tol=1e-9, abs_tol=1e-9)
                for user, c in heads
            )
        if stale:
            self._wake.set()
        if moved:
            await self._client.publish(self._counters.channel(), self._replica_id)
