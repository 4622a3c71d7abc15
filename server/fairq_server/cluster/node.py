"""A replica's membership of the cluster: its Redis connection, leases and global view.

Background tasks (never the dispatcher loop) talk to Redis:

* the heartbeat, every third of a lease: this replica's presence, and the leases of the
  reservations it holds (and of its credit, :mod:`.credit`);
* the refresher: the other replicas' reservations per backend, posted to the dispatcher as
  :class:`~fairq_server.scheduling.events.PeerView`. A release announces the counts it leaves
  (pub/sub), taken as they are; they are read from Redis every ``refresh_seconds`` (leases
  that expire announce nothing);
* the fairness sync (:mod:`.fair_sync`): journals out, shared counters back, after each
  dispatch, when another replica's head moves, and every third of a lease.

When Redis stops answering, the replica runs on its local share: each backend's threshold
and in-flight cap scaled by ``local_share`` (default one over the replicas last seen), so
the replicas together stay near the threshold instead of each filling it. It keeps trying;
when Redis answers again (even restarted empty) it goes back to the shared gate. A Redis that
refuses the replica's credentials is not an outage: that is a configuration error, logged as
one and shown apart (:mod:`.redis_state`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from fairq_server.cluster.connection import REDIS_ERRORS, ScriptCall, connect, server_ms
from fairq_server.cluster.fair_sync import COALESCE_SECONDS, FairSync
from fairq_server.cluster.fairness import SharedCounters
from fairq_server.cluster.metrics import ClusterMetrics
from fairq_server.cluster.redis_state import RedisState
from fairq_server.cluster.shared_gate import GlobalCounts, SharedGate, parse_announcement
from fairq_server.cluster.tasks import forever, spawn
from fairq_server.config.cluster import ClusterConfig
from fairq_server.runtime.supervisor import cancel_all, stop_asked
from fairq_server.scheduling import events as ev

__all__ = ["ClusterNode"]

log = logging.getLogger(__name__)


class ClusterNode:
    """One replica's membership of the cluster.

    Args:
        config: the ``[cluster]`` section.
        registry: where its metrics go (the replica's ``/metrics``).

    """

    def __init__(self, config: ClusterConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.replica_id = config.replica_id
        self._beat = config.lease_seconds / 3
        self._replicas_key = f"{config.key_prefix}:replicas"
        self.metrics = ClusterMetrics(registry, config.replica_id)
        self.client = connect(config)
        self.gate = SharedGate(self.client, config.key_prefix, config.lease_seconds)
        self.counters = SharedCounters(
            self.client, config.key_prefix, config.replica_id, config.lease_seconds
        )
        self.connected = False
        self.redis = RedisState(self.metrics.redis_state, config.safe_url)
        # When Redis first answered a heartbeat since it was lost (loop time; None: not yet).
        self._answered_at: float | None = None
        self.replicas = 1
        self._post: Callable[[ev.Event], None] = lambda event: None
        self._backend_ids: Callable[[], list[str]] = list
        # backend -> member -> still awaiting its first token
        self._held: dict[str, dict[str, bool]] = {}
        # Members forwarded on the local share and not yet put into Redis by a heartbeat.
        self._local: set[str] = set()
        # Renewals set every member held (also one Redis lost in a restart), so they must not
        # overtake a release or first token sent before them: one at a time, in order (FIFO);
        # a credit claim waits for those sent before it (:mod:`.credit`).
        self.gate_writes = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._views: dict[str, tuple[int, int, float]] = {}
        # The credit's hooks (:mod:`.credit`): the other replicas' counts, Redis lost, renewal.
        self.on_counts: Callable[[str, tuple[int, int]], None] = lambda b, p: None
        self.on_lost: Callable[[], None] = lambda: None
        self.on_renew: Callable[[], None] = lambda: None
        self._heads_channel = self.counters.channel()
        self.fair = FairSync(
            self.client, config.replica_id, self.counters, self._beat,
            lambda: self.connected, self._lost,
        )  # fmt: skip

    def attach(
        self, post: Callable[[ev.Event], None], backend_ids: Callable[[], list[str]]
    ) -> None:
        """Where to post views (the dispatcher's inbox), and which backends to watch."""
        self._post = post
        self.fair.post = post
        self._backend_ids = backend_ids

    async def start(self) -> None:
        """Join: check Redis (running on the local share if it does not answer), start tasks."""
        try:
            await self.client.ping()
            self._set_connected(True)
        except REDIS_ERRORS as exc:
            if not self.redis.failed(exc, self.local_share):
                log.warning(
                    "Redis at %s unreachable at start (%s): local share", self.config.safe_url, exc
                )
            self._set_connected(False)
        await self.heartbeat()
        self._tasks = [
            asyncio.create_task(forever(self.heartbeat, self._beat), name="heartbeat"),
            asyncio.create_task(self._refresher(), name="cluster-refresh"),
            asyncio.create_task(self.fair.run(), name="cluster-fairness"),
        ]

    async def close(self) -> None:
        """Leave: stop the tasks, give back every slot held (credit too) and the presence."""
        await cancel_all(self._tasks)
        # Bounded: a Redis that stops answering must not hold the shutdown (leases free the rest).
        with contextlib.suppress(TimeoutError, *REDIS_ERRORS):
            async with asyncio.timeout(self.config.lease_seconds):
                await asyncio.gather(*self._background, return_exceptions=True)
                if self.connected:
                    for backend_id, members in list(self._held.items()):
                        for member in list(members):
                            await self.gate.release(backend_id, member)
                    await self.client.zrem(self._replicas_key, self.replica_id)
        self._held.clear()
        await self.client.aclose()

    @property
    def reserving(self) -> bool:
        """Whether reservations go to Redis: on the shared gate, or rejoining it.

        Rejoining (Redis answered a heartbeat since it was lost, the gate still the local
        share): every request sent from now on is counted in Redis at once, since another
        replica may be back on the shared gate first, reading the counts there as all.
        """
        return self.connected or self._answered_at is not None

    @property
    def local_share(self) -> float:
        """What this replica uses of each backend alone (while Redis is unreachable)."""
        return self.config.local_share or 1.0 / max(1, self.replicas)

    # -- reservations (called by the launcher) --------------------------------------------

    async def reserve(
        self, backend_id: str, member: str, admit: Callable[[tuple[int, int]], bool],
        extra: Sequence[ScriptCall] = (), replies: list[Any] | None = None,
        handed: bool = False, counted: bool = True,
    ) -> bool | None:  # fmt: skip
        """Reserve a slot if ``admit``, told the other replicas' (awaiting, in flight), says so.

        Returns True granted, False refused (the member is withdrawn), None Redis unreachable.
        ``extra`` script calls (the request's quota reservation) ride in the claim's round
        trip; their replies go into ``replies`` (nothing when Redis was unreachable).
        ``handed``: ``member`` is a preempted request's slot, kept while its lease lives;
        ``counted``: in ``fairq_cluster_reservations_total`` (a credit's claim is not).
        """
        self._held.get(backend_id, {}).pop(member, None)  # held again below if kept
        try:
            counts, got, handed = await self.gate.reserve_slot(
                backend_id, member, extra, handed=handed
            )
            if replies is not None:
                replies.extend(got)
        except REDIS_ERRORS as exc:
            self.metrics.reservations.labels(backend_id, "unreachable").inc(int(counted))
            self._lost(exc)
            return None
        own_awaiting, own_flight = self._own(backend_id)
        peers = (max(0, counts.awaiting - own_awaiting), max(0, counts.in_flight - own_flight))
        granted = handed or admit(peers)
        if granted:
            self._held.setdefault(backend_id, {})[member] = True
            counts = GlobalCounts(counts.awaiting + 1, counts.in_flight + 1)
        else:
            self.spawn(self._leave(backend_id, member, ended=True))
        outcome = "handed" if handed else "granted" if granted else "refused"
        self.metrics.reservations.labels(backend_id, outcome).inc(int(counted))
        self._view(backend_id, counts)
        return granted

    def hold_local(self, backend_id: str, member: str) -> None:
        """Track a request forwarded on the local share (Redis unreachable).

        The heartbeat puts it into the shared gate when Redis answers again; until then its
        first token and end are not sent (Redis never had it).
        """
        self._held.setdefault(backend_id, {})[member] = True
        self._local.add(member)

    def first_token(self, backend_id: str, member: str) -> None:
        """Tell the shared gate the reserved request has its first token (in the background)."""
        members = self._held.get(backend_id)
        if members is None or member not in members:
            return
        members[member] = False
        if member not in self._local:
            self.spawn(self._leave(backend_id, member, ended=False))

    def release(self, backend_id: str, member: str) -> None:
        """Give back the slot of a reserved request that ended (in the background)."""
        members = self._held.get(backend_id)
        if members is None or members.pop(member, None) is None:
            return
        if member in self._local:
            self._local.discard(member)
        else:
            self.spawn(self._leave(backend_id, member, ended=True))

    async def _leave(self, backend_id: str, member: str, *, ended: bool) -> None:
        gate = self.gate
        async with self.gate_writes:
            if ended:
                counts = await gate.release(backend_id, member)
            else:
                counts = await gate.first_token(backend_id, member)
        self._view(backend_id, counts)  # this replica's news at once (the others': published)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a Redis write in the background (failing: Redis lost); close() waits for it."""
        spawn(self._background, coro, REDIS_ERRORS, self._lost)

    # -- the global view ------------------------------------------------------------------

    def _own(self, backend_id: str) -> tuple[int, int]:
        return sum(m := self._held.get(backend_id, {}).values()), len(m)

    def _view(self, backend_id: str, counts: GlobalCounts) -> None:
        """Post the other replicas' part of ``counts`` if it changed (and tell the credit).

        Rejoining, the counts come with the local share: they close the local gate as the
        shared one would (no retrying a refused reservation at once), but do not end the local
        share before the second beat.
        """
        self.metrics.global_awaiting.labels(backend_id).set(counts.awaiting)
        self.metrics.global_in_flight.labels(backend_id).set(counts.in_flight)
        own_awaiting, own_flight = self._own(backend_id)
        view = (
            max(0, counts.awaiting - own_awaiting),
            max(0, counts.in_flight - own_flight),
            1.0 if self.connected else self.local_share,
        )
        if self._views.get(backend_id) != view:
            self._views[backend_id] = view
            self._post(ev.PeerView(backend_id, *view))
        if self.connected:
            self.on_counts(backend_id, view[:2])

    def _lost(self, exc: BaseException) -> None:
        self.metrics.redis_errors.inc()
        self._answered_at = None
        refused = self.redis.failed(exc, self.local_share)
        if not self.connected:
            return
        if not refused:
            log.warning(
                "Redis unreachable (%s): forwarding on the local share %.2f", exc, self.local_share
            )
        self._set_connected(False)

    redis_lost = _lost  # the limit book's Redis failures are the replica's too

    def _set_connected(self, up: bool) -> None:
        self.connected = up
        self.metrics.redis_up.set(1 if up else 0)
        if up:
            self.redis.set("up")
        else:
            # The slots held stay known: still released (first token, end) and set again by
            # the heartbeat once Redis answers, so a brief timeout does not leave them counted
            # until their leases run out, and a Redis restarted empty counts them again.
            self._local_views()
            self.on_lost()  # idle credit is the shared gate's only
        self._wake.set()

    def _local_views(self) -> None:
        """Put every backend (also one registered since Redis was lost) on the local share."""
        share = self.local_share
        for backend_id in self._backend_ids():
            if self._views.get(backend_id) != (0, 0, share):
                self._views[backend_id] = (0, 0, share)
                self._post(ev.PeerView(backend_id, 0, 0, share))

    async def heartbeat(self) -> None:
        """Beat once (the background task does every third of a lease).

        Presence, leases of the slots held, the replicas alive; after Redis was lost, the
        first beat that reaches it starts the rejoining (:attr:`reserving`), and a later one,
        once every replica seen before has beaten too, goes back to the shared gate.
        """
        key, ms = self._replicas_key, round(self.config.lease_seconds * 1000)
        try:
            now = await server_ms(self.client)
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {self.replica_id: now + ms})
                pipe.zremrangebyscore(key, "-inf", now)
                pipe.zcard(key)
                _, _, alive = await pipe.execute()
            self.on_renew()
            async with self.gate_writes:  # the members as held now, not as before a release
                await self.gate.renew(self._held)
            self._local.clear()  # every member held is in Redis now
        except REDIS_ERRORS as exc:
            self._lost(exc)
            return
        alive = max(1, int(alive))
        # A Redis restarted empty counts only the replicas beaten since: off the shared gate
        # the count stays as before the loss (fewer would widen the local share, up to all).
        self.replicas = alive if self.connected else max(self.replicas, alive)
        self.metrics.replicas.set(self.replicas)
        if not self.connected:
            # Back on the shared gate only once every replica seen before has beaten since
            # (its requests counted in Redis again, reserving through Redis from then on), not
            # before the second beat that reaches Redis, at the latest a lease after the first
            # (a dead replica never beats). Until then the counts in Redis would let this one
            # fill the whole threshold on top of the others' uncounted requests.
            now_loop = asyncio.get_running_loop().time()
            if self._answered_at is None:
                self._answered_at = now_loop
                return
            if alive < self.replicas and now_loop - self._answered_at < self.config.lease_seconds:
                return
            log.warning("Redis reachable again: back on the shared gate")
            self._set_connected(True)

    async def _refresher(self) -> None:
        """Read the shared counts on every announced release, and at least every refresh."""
        while not stop_asked():
            pubsub = None
            try:
                if self.connected:
                    pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                    await pubsub.psubscribe(self.gate.channel(), self.counters.channel())
                loop = asyncio.get_running_loop()
                due = loop.time()
                while (self.connected or pubsub is None) and not stop_asked():
                    if pubsub is not None:
                        # Expired leases announce nothing: read at least every refresh.
                        wait = max(0.0, due - loop.time())
                        message = await pubsub.get_message(timeout=wait)
                        unread = False
                        while message is not None:  # take a burst of announcements at once
                            unread |= self._heard(message)
                            message = await pubsub.get_message(timeout=0)
                        if not unread and loop.time() < due:
                            continue
                        due = loop.time() + self.config.refresh_seconds
                    else:
                        if self._answered_at is None:  # rejoining: views come with reservations
                            self._local_views()
                        self._wake.clear()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(self.config.refresh_seconds):
                                await self._wake.wait()
                        if self.connected:
                            break  # subscribe now
                        continue
                    await self._refresh()
                    # A burst of releases shares one read: at most one per COALESCE.
                    await asyncio.sleep(COALESCE_SECONDS)
            except REDIS_ERRORS as exc:
                self._lost(exc)
            except Exception:
                log.exception("cluster refresher failed")
                await asyncio.sleep(self.config.refresh_seconds)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _heard(self, message: dict[str, Any]) -> bool:
        """Apply one announcement; return True if the shared counts must be read instead."""
        channel, data = (
            v.decode(errors="replace") if isinstance(v, bytes) else str(v)
            for v in (message.get("channel"), message.get("data"))
        )
        if channel == self._heads_channel:
            if data != self.replica_id:  # its own announcement: nothing new to read
                self.fair.wake()  # the fairness sync reads the heads
            return False
        news = parse_announcement(channel, data, self.config.key_prefix)
        if news is None:
            return True
        self._view(*news)
        return False

    async def _refresh(self) -> None:
        for backend_id, counts in (await self.gate.counts(self._backend_ids())).items():
            self._view(backend_id, counts)
