"""The ext_proc door's settings (``[extproc]``) and the Envoy bootstrap's (``[envoy]``).

Part of the configuration (:mod:`fairq_server.config` re-exports both); kept beside the door.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EnvoyConfig", "ExtprocConfig"]


@dataclass(frozen=True)
class ExtprocConfig:
    """The ext_proc door: fairq as the endpoint picker of an Envoy in front of the backends.

    Attributes:
        listen: ``host:port`` of the door's gRPC server (Envoy's external processing service
            and its access log service); empty turns the door off.
        include_usage: add ``stream_options.include_usage`` to a streamed request that does
            not ask for it, so the backend's usage block ends the stream (the client sees
            that one chunk more); without a usage block fairq charges an estimate.
        usage_grace_seconds: after Envoy closes a request's stream, how long its slot waits
            for the access log entry with its usage before it is freed on an estimate.
        max_request_seconds: a dispatched request whose end Envoy never reports frees its
            slot after this (a lost stream; the client's own timeouts are shorter).
        max_connections: Envoy's connections to the door at most (gRPC closes more).

    """

    listen: str = ""
    include_usage: bool = True
    usage_grace_seconds: float = 1.0
    max_request_seconds: float = 3600.0
    max_connections: int = 1024


@dataclass(frozen=True)
class EnvoyConfig:
    """What ``fairq envoy bootstrap`` puts in the Envoy configuration it prints.

    Attributes:
        listen: where Envoy serves clients.
        admin_listen: Envoy's admin interface (empty: none).
        replicas: every fairq replica's ext_proc door as ``name=host:port`` (its
            ``cluster.replica_id`` and ``extproc.listen``); empty: this file's own.
        message_timeout_seconds: how long Envoy waits for fairq to answer a request (its
            time in the queue; 0: the queue's TTL and a margin, or 300 s without a TTL).
        connect_timeout_seconds: to fairq and the backends: fairq down is a 503 after it.

    """

    listen: str = "127.0.0.1:10000"
    admin_listen: str = ""
    replicas: tuple[str, ...] = ()
    message_timeout_seconds: float = 0.0
    connect_timeout_seconds: float = 0.25
