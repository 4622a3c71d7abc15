"""One registry for every replica: RPC registrations in a Redis hash, changes announced.

``RegisterBackend`` on any replica writes the hash and publishes; every replica reconciles
its backends with the hash on the announcement and at least every few seconds (a missed
message, a replica that was partitioned). The hash has no expiry: the registrations survive
a restart of every replica (not a Redis restarted empty: an operator who needs that runs
Redis with persistence, see docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from fairq_server.backends.registrations import backend_from_json, backend_to_json
from fairq_server.cluster.connection import REDIS_ERRORS
from fairq_server.config.backends import BackendConfig
from fairq_server.runtime.supervisor import stop_asked

__all__ = ["RedisRegistrations", "watch"]

log = logging.getLogger(__name__)

#: Longest time between two reads of the registry (announcements make it immediate).
POLL_SECONDS = 2.0


class RedisRegistrations:
    """Registrations in ``<prefix>:backends`` (id -> JSON), changes on ``<prefix>:registry``."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self.key = f"{prefix}:backends"
        self.channel = f"{prefix}:registry"

    async def raw(self) -> dict[str, str]:
        """Return every registration as stored (id -> JSON)."""
        rows = await self._client.hgetall(self.key)
        return {_text(k): _text(v) for k, v in rows.items()}

    async def load(self) -> list[BackendConfig]:
        """See :meth:`fairq_server.backends.registrations.Registrations.load`."""
        return [backend_from_json(v) for v in (await self.raw()).values()]

    async def put(self, cfg: BackendConfig) -> None:
        """See :meth:`fairq_server.backends.registrations.Registrations.put`."""
        await self._client.hset(self.key, cfg.id, backend_to_json(cfg))
        await self._client.publish(self.channel, cfg.id)

    async def delete(self, backend_id: str) -> None:
        """See :meth:`fairq_server.backends.registrations.Registrations.delete`."""
        await self._client.hdel(self.key, backend_id)
        await self._client.publish(self.channel, backend_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def watch(
    client: aioredis.Redis,
    registrations: RedisRegistrations,
    apply: Callable[[dict[str, str]], Awaitable[None]],
) -> None:
    """Apply the registry now, on every announcement and every :data:`POLL_SECONDS`."""
    while not stop_asked():
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(registrations.channel)
            while not stop_asked():
                await apply(await registrations.raw())
                message = await pubsub.get_message(timeout=POLL_SECONDS)
                while message is not None:
                    message = await pubsub.get_message(timeout=0)
        except REDIS_ERRORS as exc:
            log.warning("registry unreadable (%s); the backends known stay", exc)
            await asyncio.sleep(POLL_SECONDS / 2)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
