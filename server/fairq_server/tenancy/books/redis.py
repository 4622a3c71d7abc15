"""The limit book of a cluster: every replica's grants counted in Redis.

Each :class:`~fairq_server.tenancy.books.book.LimitKey` is one Redis hash of buckets (see
:mod:`.redis_scripts`); a reservation is one Lua script over all of a request's keys, atomic
in Redis: it checks every key and adds to every key only if none has reached its limit. So
each reservation sees every grant made before it on any replica, and the grants of any window
stay within the limit plus one request's amount whatever the replica count. A settlement is
one script too. Windows are read on Redis's clock (``TIME``), so replicas whose clocks
disagree still count the same minute and the same day.

The reservation can ride in the round trip the replica already makes for its slot claim
(:meth:`RedisBook.reserve_call` gives the script call and the reader of its reply, which
:meth:`~fairq_server.cluster.shared_gate.SharedGate.claim_with` sends in one pipeline).

While Redis is unreachable the book grants from its ``fallback`` (a one-process book) with
each limit scaled by ``share`` (the replica's local share, as the shared gate does): the
replicas together stay near the limit, and serving does not stop because Redis did. Grants
made there are settled there. Failing open (granting everything) would let an outage spend a
month's budget; failing closed would turn a Redis outage into a service outage.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq_server.tenancy.books.book import (
    Grant,
    LimitBook,
    LimitKey,
    LimitUse,
    Refusal,
    Window,
)
from fairq_server.tenancy.books.redis_scripts import READ, RESERVE, RESTORE, SETTLE

__all__ = ["REDIS_ERRORS", "RedisBook", "ReserveReader", "ScriptCall", "redis_key"]

log = logging.getLogger(__name__)

_WINDOWS = {Window.MINUTE: "m", Window.DAY: "d", Window.MONTH: "M"}
# Redis's Lua reads no "inf": an unbounded limit goes as the largest double.
_UNBOUNDED = "1.7976931348623157e308"

# The cluster's own definitions (cluster.connection), repeated: the cluster package imports
# the scheduling layer, which uses this book, so importing it here would close a circle.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)
#: One call of a Lua script (as ``cluster.connection.ScriptCall``): script, keys, arguments.
ScriptCall = tuple[AsyncScript, Sequence[str], Sequence[str | int | float]]
#: Turns the reply of a reservation's script call into its outcome.
ReserveReader = Callable[[Any], Grant | Refusal]


def redis_key(prefix: str, key: LimitKey) -> str:
    """Return the Redis key of ``key``: names length-prefixed, so no two keys collide.

    Whatever a subject or model holds (colons, unicode, a key-shaped name), the length before
    it says where it ends; a missing model is ``-``, which no length starts with.
    """
    model = "-" if key.model is None else f"{len(key.model)}:{key.model}"
    return (
        f"{prefix}:quota:{key.scope.value}:{key.measure.value}:{key.window.value}:"
        f"{len(key.subject)}:{key.subject}:{model}"
    )


@dataclass(frozen=True)
class _InRedis:
    """A grant held in Redis: the epoch it was made in and the bucket of each key."""

    epoch: str
    keys: tuple[str, ...]
    buckets: tuple[str, ...]


@dataclass(frozen=True)
class _Local:
    """A grant made by the fallback book while Redis was unreachable."""

    grant: Grant


def _number(value: object) -> float:
    return float(value.decode() if isinstance(value, bytes) else str(value))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check(uses: Sequence[LimitUse]) -> None:
    for use in uses:
        if not (math.isfinite(use.amount) and use.amount >= 0):
            raise ValueError(f"limit book: amount {use.amount!r} for {use.key} is not >= 0")
        if not use.limit > 0:
            raise ValueError(f"limit book: limit {use.limit!r} for {use.key} is not > 0")


class RedisBook(LimitBook):
    """A :class:`LimitBook` shared by the replicas of a cluster through Redis.

    Args:
        client: the replica's Redis client (the cluster's connection).
        prefix: the cluster's key prefix.
        fallback: the one-process book granting while Redis is unreachable.
        share: this replica's part of each limit while Redis is unreachable (the cluster's
            local share).
        available: whether to try Redis at all (False while the replica knows it is lost, so
            a request does not wait for a timeout).
        lost: told of each Redis failure (the cluster's log line, metric and state).
        registry: where the book's metrics go (None: not exported).

    """

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        fallback: LimitBook,
        *,
        share: Callable[[], float] = lambda: 1.0,
        available: Callable[[], bool] = lambda: True,
        lost: Callable[[BaseException], None] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._fallback = fallback
        self._share = share
        self._available = available
        self._lost = lost
        self._epoch_key = f"{prefix}:quota-epoch"
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)
        self._read = client.register_script(READ)
        self._restore = client.register_script(RESTORE)
        #: Milliseconds added to Redis's clock in every script (tests move windows with it).
        self.clock_offset_ms = 0
        self.reservations = Counter(
            "fairq_cluster_quota_reservations",
            "Limit book reservations by where they were decided (redis, or local while Redis "
            "is unreachable) and outcome (granted, refused).",
            ["path", "outcome"],
            registry=registry,
        )
        self.settle_failures = Counter(
            "fairq_cluster_quota_settle_failures",
            "Settlements Redis did not take (unreachable): the reserved amount stays counted.",
            registry=registry,
        )

    # -- reserve ---------------------------------------------------------------------------

    def reserve_call(self, uses: Sequence[LimitUse]) -> tuple[ScriptCall, ReserveReader]:
        """Return the script call of a reservation of ``uses``, and the reader of its reply.

        For a caller that sends it with other scripts in one round trip (the slot claim);
        :meth:`reserve` sends it alone.

        Raises:
            ValueError: an amount is negative or not finite, or a limit is not above 0.

        """
        _check(uses)
        keys = [self._epoch_key, *(redis_key(self._prefix, u.key) for u in uses)]
        args: list[str | int | float] = [self.clock_offset_ms]
        for use in uses:
            limit = repr(float(use.limit)) if math.isfinite(use.limit) else _UNBOUNDED
            args += [_WINDOWS[use.key.window], repr(float(use.amount)), limit]
        frozen = tuple(uses)

        def read(reply: Any) -> Grant | Refusal:
            if int(reply[0]) == 0:
                use = frozen[int(reply[1]) - 1]
                self.reservations.labels("redis", "refused").inc()
                return Refusal(use, _number(reply[2]), _number(reply[3]) / 1000)
            n = len(frozen)
            token = _InRedis(
                _text(reply[1]), tuple(keys[1:]), tuple(_text(b) for b in reply[2 : 2 + n])
            )
            self.reservations.labels("redis", "granted").inc()
            return Grant(token, frozen, tuple(_number(v) for v in reply[2 + n : 2 + 2 * n]))

        return (self._reserve, keys, args), read

    async def reserve(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Grant every use in Redis, or none (the fallback's, scaled, while it is lost)."""
        if not uses:
            return Grant(_InRedis("", (), ()), (), ())
        if self._available():
            call, read = self.reserve_call(uses)
            script, keys, args = call
            try:
                reply = await script(keys=list(keys), args=list(args))
            except REDIS_ERRORS as exc:
                self.failed(exc)
            else:
                return read(reply)
        return await self.reserve_local(uses, now)

    async def reserve_local(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Reserve from the fallback book with each limit scaled by the local share.

        Also for a caller whose joined round trip (:meth:`reserve_call`) failed.
        """
        share = self._share()
        scaled = [LimitUse(u.key, u.amount, u.limit * share) for u in uses]
        outcome = await self._fallback.reserve(scaled, now)
        if isinstance(outcome, Refusal):
            self.reservations.labels("local", "refused").inc()
            original = uses[scaled.index(outcome.use)]
            return Refusal(original, outcome.used, outcome.retry_after)
        self.reservations.labels("local", "granted").inc()
        return Grant(_Local(outcome), tuple(uses), outcome.used)

    def failed(self, exc: BaseException) -> None:
        """Note a Redis failure (the cluster logs it and shows it in its metrics)."""
        if self._lost is not None:
            self._lost(exc)
        else:
            log.warning("limit book: Redis unreachable (%s): granting on the local share", exc)

    # -- settle ----------------------------------------------------------------------------

    async def settle(self, grant: Grant, actual: Sequence[float]) -> None:
        """Replace each reserved amount by the actual one, where the grant was made.

        A grant from before a Redis restart is not settled (the restarted Redis never held
        it); one that Redis does not take now (unreachable) keeps its reserved amount counted
        until its window passes, the cautious side.
        """
        if len(actual) != len(grant.uses):
            raise ValueError(
                f"limit book: {len(actual)} actual amounts for {len(grant.uses)} reserved"
            )
        token = grant.token
        if isinstance(token, _Local):
            await self._fallback.settle(token.grant, actual)
            return
        if not isinstance(token, _InRedis):
            raise TypeError(f"limit book: not a grant of this book: {token!r}")
        if not token.keys:
            return
        args: list[str | int | float] = [self.clock_offset_ms, token.epoch]
        for use, bucket, amount in zip(grant.uses, token.buckets, actual, strict=True):
            change = float(amount) - use.amount if math.isfinite(amount) else 0.0
            args += [bucket, repr(change)]
        try:
            await self._settle(keys=[self._epoch_key, *token.keys], args=args)
        except REDIS_ERRORS as exc:
            self.settle_failures.inc()
            self.failed(exc)

    # -- read ------------------------------------------------------------------------------

    async def used(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """Each key's used amount in its current window (the fallback's while Redis is lost)."""
        if not keys:
            return []
        if self._available():
            redis_keys = [self._epoch_key, *(redis_key(self._prefix, k) for k in keys)]
            args: list[str | int | float] = [self.clock_offset_ms]
            args += [_WINDOWS[k.window] for k in keys]
            try:
                reply = await self._read(keys=redis_keys, args=args)
            except REDIS_ERRORS as exc:
                self.failed(exc)
            else:
                return [_number(v) for v in reply]
        return await self._fallback.used(keys, now)

    async def restore(self, amounts: Sequence[tuple[LimitKey, float]]) -> int:
        """Add stored calendar amounts to the current periods, once per period in Redis.

        For a Redis that started empty (the day's and month's usage comes back from the
        store); a Redis that already took them (another replica started first) is left as it
        is. Rolling windows are skipped. Returns how many keys took their amount.

        Raises:
            redis.exceptions.RedisError: Redis did not answer (the caller logs it; the
                amounts are offered again at the next start).

        """
        chosen = [(k, a) for k, a in amounts if k.window is not Window.MINUTE and a > 0]
        if not chosen:
            return 0
        keys = [self._epoch_key, *(redis_key(self._prefix, k) for k, _ in chosen)]
        args: list[str | int | float] = [self.clock_offset_ms]
        for key, amount in chosen:
            args += [_WINDOWS[key.window], repr(float(amount))]
        return int(await self._restore(keys=keys, args=args))
