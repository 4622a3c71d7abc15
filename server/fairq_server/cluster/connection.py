"""The Redis connection of a replica: URL, password, TLS, timeouts and reconnection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq_server.config.cluster import ClusterConfig

__all__ = ["REDIS_ERRORS", "ScriptCall", "connect", "run_scripts", "server_ms"]

#: What a lost, stopped or partitioned Redis raises.
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


def connect(config: ClusterConfig, *, timeout: float | None = None) -> aioredis.Redis:
    """Return a client for ``config.redis_url`` (``rediss://`` is TLS; ``password_env`` applies).

    Operations time out well within a lease (a third of it by default), so a partitioned
    Redis is noticed and the replica falls back to its local share before its
    reservations would have expired anyway. One quick retry covers a connection that a
    restarted Redis closed.
    """
    timeout = timeout if timeout is not None else min(1.0, config.lease_seconds / 3)
    kwargs: dict[str, object] = {}
    if config.password is not None:
        kwargs["password"] = config.password
    if config.redis_url.startswith("rediss://") and config.tls_ca_file:
        kwargs["ssl_ca_certs"] = config.tls_ca_file
    return aioredis.Redis.from_url(
        config.redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), 1),
        retry_on_error=[RedisConnectionError],
        client_name=f"fairq-{config.replica_id}"[:64],
        **kwargs,  # type: ignore[arg-type]
    )


#: One call of a Lua script: the script, its keys, its arguments.
ScriptCall = tuple[AsyncScript, Sequence[str], Sequence[str | int | float]]


async def run_scripts(client: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run script calls in one round trip; return their replies in order.

    A pipeline of registered scripts costs a second round trip each time (redis-py asks
    ``SCRIPT EXISTS`` first), so the calls go as plain ``EVALSHA``; only the calls whose
    script Redis has lost (restarted, or never given it) are sent again once it is loaded,
    so a call that ran is never run twice (scripts of different kinds ride together: the
    slot claim and the quota reservation). One call goes on its own.

    Raises:
        redis.exceptions.RedisError: a call failed (the first failure).

    """
    if len(calls) == 1:
        script, keys, args = calls[0]
        return [await script(keys=list(keys), args=list(args))]
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        async with client.pipeline(transaction=False) as pipe:
            for i in todo:
                script, keys, args = calls[i]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            got = await pipe.execute(raise_on_error=False)
        missing = []
        for i, reply in zip(todo, got, strict=True):
            if isinstance(reply, NoScriptError) and not attempt:
                missing.append(i)
            elif isinstance(reply, Exception):
                raise reply
            replies[i] = reply
        if not missing:
            return replies
        for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
            script.sha = await client.script_load(script.script)
        todo = missing
    raise AssertionError("unreachable")


async def server_ms(client: aioredis.Redis) -> int:
    """Return Redis's own clock in milliseconds: the clock every lease is scored by."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000
