"""The ``[cluster]`` section: where the replicas meet (Redis) and how they behave without it.

Example::

    [cluster]
    redis_url = "rediss://fairq@redis.internal:6380/0"   # rediss:// is TLS
    password_env = "FAIRQ_REDIS_PASSWORD"                # or a password in the URL
    replica_id = "fairq-0"                               # default: host name and pid
    lease_seconds = 5.0
    local_share = 0.0                                    # 0: 1 / replicas last seen

No ``[cluster]`` section: one process, no Redis, exactly the single-process behaviour.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from fairq_server.errors import ConfigError

__all__ = ["MAX_CREDIT_SLOTS", "ClusterConfig"]

#: Most ``credit_slots`` per backend: idle slots hold capacity the other replicas cannot use.
MAX_CREDIT_SLOTS = 64


@dataclass(frozen=True)
class ClusterConfig:
    """How this replica joins the others.

    Attributes:
        redis_url: ``redis://`` or ``rediss://`` (TLS) URL; a password may be in it
            (``redis://:secret@host:6379/0``).
        password_env: environment variable holding the Redis password (overrides the URL's).
        tls_ca_file: CA bundle to verify a ``rediss://`` server with (empty: system CAs).
        replica_id: this replica's name in Redis and in metrics (default: host name and pid).
        key_prefix: prefix of every Redis key, so several fairq clusters can share one Redis.
        lease_seconds: a reservation on a backend (a forwarded request) and a replica's
            presence last this long unless renewed; a replica killed with SIGKILL holds
            nothing longer.
        refresh_seconds: longest wait between two reads of the global view (slots held by
            other replicas, fairness counters); releases are also announced at once.
        local_share: share of each backend's threshold and in-flight cap this replica uses
            on its own while Redis is unreachable (0: one over the number of replicas last
            seen alive).
        fairness_slack: a replica dispatches a user only while that user's fairness counter
            is within this of the smallest counter of any other user backlogged on another
            replica (units of the fairness policy: requests for round-robin, tokens for vtc).
            0, the default, is the order one scheduler would keep; more lets a replica go on
            serving its own users for that much while the replica holding the user furthest
            behind is slow to take its turn.
        credit_slots: slots of each backend this replica claims in the shared gate ahead of
            its requests, so a dispatch sends without a Redis round trip (0: every request
            reserves on its way). Claimed only while the gate has room for one more request
            beyond them, given back when the backend is full; they count against the
            threshold like requests.

    """

    redis_url: str
    password_env: str = ""
    tls_ca_file: str = ""
    replica_id: str = ""
    key_prefix: str = "fairq"
    lease_seconds: float = 5.0
    refresh_seconds: float = 0.1
    local_share: float = 0.0
    fairness_slack: float = 0.0
    credit_slots: int = 1

    def __post_init__(self) -> None:
        scheme = urlsplit(self.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"cluster.redis_url must be redis://, rediss:// or unix://, not {self.redis_url!r}"
            )
        if not self.lease_seconds > 0 or not self.refresh_seconds > 0:
            raise ConfigError("cluster.lease_seconds and cluster.refresh_seconds must be above 0")
        if self.refresh_seconds >= self.lease_seconds:
            raise ConfigError("cluster.refresh_seconds must be below cluster.lease_seconds")
        if not 0 <= self.local_share <= 1:
            raise ConfigError(f"cluster.local_share is a fraction 0-1, not {self.local_share!r}")
        if self.fairness_slack < 0:
            raise ConfigError("cluster.fairness_slack must be 0 or more")
        if not 0 <= self.credit_slots <= MAX_CREDIT_SLOTS:
            raise ConfigError(
                f"cluster.credit_slots is 0-{MAX_CREDIT_SLOTS} slots per backend, "
                f"not {self.credit_slots!r}"
            )
        if self.password_env and self.password_env not in os.environ:
            raise ConfigError(f"cluster.password_env: ${self.password_env} is not set")
        if not self.replica_id:
            object.__setattr__(self, "replica_id", f"{socket.gethostname()}-{os.getpid()}")

    @property
    def password(self) -> str | None:
        """The password from ``password_env``, if named (else the URL's applies)."""
        return os.environ[self.password_env] if self.password_env else None

    @property
    def safe_url(self) -> str:
        """``redis_url`` without its password, for logs."""
        parts = urlsplit(self.redis_url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"
