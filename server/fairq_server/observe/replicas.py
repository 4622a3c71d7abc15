"""Every replica's live view, through Redis: each publishes its own, the console reads all.

A replica writes its :class:`~fairq_server.observe.live.LiveView` (as JSON) under
``<prefix>:console:<replica>`` with an expiry of a few refresh intervals, so a replica that
stops is gone from the console within seconds, without anyone cleaning up. Reading scans
those keys (one per replica) and fetches them in one round trip. Nothing here is on the
request path; a Redis error costs one refresh of the view, and is logged once per outage.
"""

from __future__ import annotations

import json
import logging
from typing import Any

__all__ = ["MAX_VIEW_BYTES", "ReplicaViews"]

log = logging.getLogger(__name__)

# A view larger than this is not published whole: its user rows are cut (counts stay).
MAX_VIEW_BYTES = 512 * 1024
_MAX_REPLICAS = 256


class ReplicaViews:
    """Publishes this replica's view and reads every replica's.

    Args:
        client: the cluster's Redis client.
        prefix: the cluster's key prefix.
        replica: this replica's id.
        ttl_seconds: how long a published view lives (a few refresh intervals).

    """

    def __init__(self, client: Any, prefix: str, replica: str, ttl_seconds: int) -> None:
        # redis.asyncio.Redis; typed loosely so one process never imports the Redis client.
        self._client = client
        self._pattern = f"{prefix}:console:*"
        self._key = f"{prefix}:console:{replica}"
        self._ttl = max(1, ttl_seconds)
        self._failing = False

    async def publish(self, view: dict[str, Any]) -> None:
        """Write ``view`` (this replica's) with its expiry."""
        body = json.dumps(view, separators=(",", ":")).encode()
        if len(body) > MAX_VIEW_BYTES:
            for model in view.get("models", []):
                model["rows"] = model["rows"][:5]
            body = json.dumps(view, separators=(",", ":")).encode()
        try:
            await self._client.set(self._key, body, ex=self._ttl)
            self._recovered()
        except Exception as exc:  # any Redis failure: skip one refresh
            self._failed(exc)

    async def read(self) -> list[dict[str, Any]]:
        """Return every replica's published view (this one's too), by replica id."""
        try:
            keys = []
            async for key in self._client.scan_iter(match=self._pattern, count=100):
                keys.append(key.decode() if isinstance(key, bytes) else str(key))
                if len(keys) >= _MAX_REPLICAS:
                    break
            values = await self._client.mget(sorted(keys)) if keys else []
            self._recovered()
        except Exception as exc:  # any Redis failure: this replica alone
            self._failed(exc)
            return []
        views = []
        for key, value in zip(sorted(keys), values, strict=True):
            if value is None or len(value) > 2 * MAX_VIEW_BYTES:
                continue  # expired between the scan and the read, or not ours
            try:
                view = json.loads(value)
            except ValueError:
                log.warning("console: %s holds no JSON view; skipped", key[:200])
                continue
            if isinstance(view, dict) and isinstance(view.get("replica"), str):
                views.append(view)
        return sorted(views, key=lambda v: str(v["replica"]))

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            log.warning("console: Redis unreachable for the cluster view (%s)", exc)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.info("console: Redis reachable again for the cluster view")
        self._failing = False
