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
from typing import Annotated
from urllib.parse import urlsplit

from fairq_server.config.fields import Float, Int, Str, doc, section
from fairq_server.errors import ConfigError

__all__ = ["MAX_CREDIT_SLOTS", "ClusterConfig"]

#: Most ``credit_slots`` per backend: idle slots hold capacity the other replicas cannot use.
MAX_CREDIT_SLOTS = 64


@section
@dataclass(frozen=True)
class ClusterConfig:
    """How this replica joins the others."""

    redis_url: Annotated[
        Str,
        doc(
            "``redis://`` or ``rediss://`` (TLS) URL; a password may be in it "
            "(``redis://:secret@host:6379/0``)"
        ),
    ]
    password_env: Annotated[
        Str, doc("environment variable holding the Redis password (overrides the URL's)")
    ] = ""
    tls_ca_file: Annotated[
        Str, doc("CA bundle to verify a ``rediss://`` server with (empty: system CAs)")
    ] = ""
    replica_id: Annotated[
        Str, doc("this replica's name in Redis and in metrics (default: host name and pid)")
    ] = ""
    key_prefix: Annotated[
        Str, doc("prefix of every Redis key, so several fairq clusters can share one Redis")
    ] = "fairq"
    lease_seconds: Annotated[
        Float,
        doc(
            "a reservation on a backend and a replica's presence last this long unless "
            "renewed; a replica killed with SIGKILL holds nothing longer",
            gt=0,
        ),
    ] = 5.0
    refresh_seconds: Annotated[
        Float,
        doc(
            "longest wait between two reads of the global view (below ``lease_seconds``); "
            "releases are also announced at once",
            gt=0,
        ),
    ] = 0.1
    local_share: Annotated[
        Float,
        doc(
            "share of each backend's threshold and in-flight cap this replica uses on its own "
            "while Redis is unreachable (0: one over the number of replicas last seen alive)",
            ge=0,
            le=1,
        ),
    ] = 0.0
    fairness_slack: Annotated[
        Float,
        doc(
            "a replica dispatches a user only while that user's fairness counter is within "
            "this of the smallest counter of any user backlogged on another replica (0: the "
            "order one scheduler would keep)",
            ge=0,
        ),
    ] = 0.0
    credit_slots: Annotated[
        Int,
        doc(
            "slots of each backend this replica claims in the shared gate ahead of its "
            "requests, so a dispatch sends without a Redis round trip (0: every request "
            "reserves on its way)",
            ge=0,
            le=MAX_CREDIT_SLOTS,
        ),
    ] = 1

    def __post_init__(self) -> None:
        scheme = urlsplit(self.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"cluster.redis_url must be redis://, rediss:// or unix://, not {self.redis_url!r}"
            )
        if self.refresh_seconds >= self.lease_seconds:
            raise ConfigError("cluster.refresh_seconds must be below cluster.lease_seconds")
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
