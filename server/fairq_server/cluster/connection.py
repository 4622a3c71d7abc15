"""The Redis connection of a replica: URL, password, TLS, timeouts and reconnection."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq_server.cluster.settings import ClusterConfig

__all__ = ["REDIS_ERRORS", "connect"]

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
