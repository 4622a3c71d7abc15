"""The ``[extproc]`` and ``[envoy]`` sections: fairq as the endpoint picker of an Envoy.

``[extproc]`` is the door Envoy calls (its external processing and access log services);
``[envoy]`` is what ``fairq envoy bootstrap`` writes into the Envoy configuration it prints
(``docs/envoy.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Bool, Float, Int, Str, doc, section

__all__ = ["EnvoyConfig", "ExtprocConfig"]


@section
@dataclass(frozen=True)
class ExtprocConfig:
    """The ext_proc door: fairq as the endpoint picker of an Envoy in front of the backends."""

    listen: Annotated[
        Str,
        doc(
            "``host:port`` of the door's gRPC server (Envoy's external processing service "
            "and its access log service); empty: the door is off"
        ),
    ] = ""
    include_usage: Annotated[
        Bool,
        doc(
            "add ``stream_options.include_usage`` to a streamed request that does not ask for "
            "it, so the backend's usage block ends the stream (without it fairq charges an "
            "estimate)"
        ),
    ] = True
    usage_grace_seconds: Annotated[
        Float,
        doc(
            "after Envoy closes a request's stream, how long its slot waits for the access log "
            "entry with its usage before it is freed on an estimate",
            ge=0,
        ),
    ] = 1.0
    max_request_seconds: Annotated[
        Float,
        doc(
            "a dispatched request whose end Envoy never reports frees its slot after this",
            gt=0,
        ),
    ] = 3600.0
    max_connections: Annotated[
        Int, doc("Envoy's connections to the door at most (gRPC closes more)", gt=0)
    ] = 1024


@section
@dataclass(frozen=True)
class EnvoyConfig:
    """What ``fairq envoy bootstrap`` puts in the Envoy configuration it prints."""

    listen: Annotated[Str, doc("where Envoy serves clients")] = "127.0.0.1:10000"
    admin_listen: Annotated[Str, doc("Envoy's admin interface (empty: none)")] = ""
    replicas: Annotated[
        tuple[Str, ...],
        doc(
            "every fairq replica's ext_proc door as ``name=host:port`` (its "
            "``cluster.replica_id`` and ``extproc.listen``); empty: this file's own"
        ),
    ] = ()
    message_timeout_seconds: Annotated[
        Float,
        doc(
            "how long Envoy waits for fairq to answer a request (its time in the queue; 0: the "
            "queue's TTL and a margin, or 300 s without a TTL)",
            ge=0,
        ),
    ] = 0.0
    connect_timeout_seconds: Annotated[
        Float,
        doc(
            "Envoy's connect timeout to fairq and the backends: fairq down is a 503 after it", gt=0
        ),
    ] = 0.25
    read_usage: Annotated[
        Bool,
        doc(
            "Envoy's Lua filter reads the backend's usage block from the tail of each response "
            "chunk; false: fairq charges tokens estimated from the response's bytes"
        ),
    ] = True
