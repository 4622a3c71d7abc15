"""What a replica knows of its Redis: up, unreachable, or refusing fairq's credentials.

An unreachable Redis is an outage the replica rides out on its local share and recovers from
by itself. A Redis that refuses the credentials (``WRONGPASS``, ``NOAUTH``) is a
configuration error that never passes by itself, so it is logged as an error when it starts
and shown apart in ``fairq_cluster_redis_state{state="credentials_refused"}``.
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge
from redis.exceptions import AuthenticationError

__all__ = ["STATES", "RedisState"]

log = logging.getLogger(__name__)

STATES = ("up", "unreachable", "credentials_refused")


class RedisState:
    """The state of one replica's Redis, kept in its ``fairq_cluster_redis_state`` gauge.

    Args:
        gauge: the gauge, labelled by state (1 for the current one, 0 for the others).
        safe_url: the Redis URL without its password, for the log.

    """

    def __init__(self, gauge: Gauge, safe_url: str) -> None:
        self._gauge = gauge
        self._safe_url = safe_url
        self.state = ""

    def set(self, state: str) -> None:
        """Enter ``state`` (one of :data:`STATES`)."""
        self.state = state
        for name in STATES:
            self._gauge.labels(name).set(1 if name == state else 0)

    def failed(self, exc: BaseException, local_share: float) -> bool:
        """Set the state a failed operation shows; return whether Redis refused the credentials."""
        refused = isinstance(exc, AuthenticationError)
        state = "credentials_refused" if refused else "unreachable"
        if refused and self.state != state:
            log.error(
                "Redis at %s refused fairq's credentials (%s): set the password in "
                "cluster.redis_url or the variable named by cluster.password_env to Redis's "
                "(requirepass / ACL user); until then this replica runs on its local share "
                "%.2f, without the shared gate or shared fairness",
                self._safe_url,
                exc,
                local_share,
            )
        self.set(state)
        return refused
