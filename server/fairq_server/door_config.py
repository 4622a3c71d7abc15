"""What the doors accept: request bounds (``[limits]``), TLS, the HTTP and ext_proc doors.

Part of the configuration (:mod:`fairq_server.config` re-exports every name); kept apart so each
module stays one concept of a readable size.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

__all__ = [
    "EnvoyConfig",
    "ExtprocConfig",
    "HttpConfig",
    "Limits",
    "Network",
    "TlsConfig",
    "parse_networks",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Limits:
    """Bounds on request input (larger requests get INVALID_ARGUMENT) and on buffering.

    Attributes:
        max_unread_chars: generated text held for a caller that does not read it; past
            this, the request ends with RESOURCE_EXHAUSTED and its backend request is
            aborted, so a stalled reader holds neither memory nor a backend slot.
        max_extra_bytes, max_extra_depth: bound the pass-through parameters (the gRPC
            ``extra`` Struct, the fields of an HTTP body fairq does not interpret), measured
            as compact JSON.
        max_body_bytes: bounds an HTTP request body (413 above it).
        max_streams_per_connection: HTTP/2 ``MAX_CONCURRENT_STREAMS`` advertised to clients;
            a client's further calls wait in its own gRPC library for a free stream. A queued
            request holds its stream: keep it at or above ``max_queued_per_user``.
        max_grpc_connections: connections open on the gRPC port at most; gRPC closes one
            more before its handshake.
        request_receive_seconds: a call whose complete request message has not arrived this
            long after the call opened is answered DEADLINE_EXCEEDED and its stream freed.
        default_max_tokens: the output bound sent for a request that gives none (0: the
            limit ``max_tokens`` itself), so a backend's own default never applies.
        max_sequences: the largest ``n`` / ``best_of`` passed through to the engine (the gRPC
            door's ``extra``, HTTP's ``best_of``); those sequences are generated in the one
            backend slot fairq admitted the request to.
        max_choices: the largest ``n`` of an HTTP request; each choice is scheduled as its
            own request (its own backend slot, charged to the caller), as vLLM runs ``n``
            as ``n`` requests.
        max_prompts: the longest list of prompts one completions request may carry; each
            prompt is scheduled as its own request.

    """

    max_prompt_chars: int = 1_000_000
    max_messages: int = 1_000
    max_tokens: int = 32_768
    max_stop_strings: int = 4
    max_stop_chars: int = 1_000
    max_metadata_bytes: int = 16_384
    max_unread_chars: int = 1_000_000
    max_extra_bytes: int = 262_144
    max_extra_depth: int = 32
    max_body_bytes: int = 8_388_608
    max_streams_per_connection: int = 10_000
    max_grpc_connections: int = 4096
    request_receive_seconds: float = 10.0
    default_max_tokens: int = 0
    max_sequences: int = 1
    max_prompts: int = 64
    max_choices: int = 16


@dataclass(frozen=True)
class TlsConfig:
    """TLS for the gRPC port; with ``client_ca_file``, clients must present a certificate.

    Attributes:
        cert_file: PEM certificate chain of the server.
        key_file: PEM private key of the server.
        client_ca_file: PEM CA bundle; when set, mutual TLS is required.

    """

    cert_file: str
    key_file: str
    client_ca_file: str = ""


@dataclass(frozen=True)
class HttpConfig:
    """The OpenAI-compatible HTTP door (``/v1/chat/completions``, ``/v1/completions``).

    Attributes:
        listen: ``host:port`` to serve on; empty turns the door off.
        body_timeout_seconds: a request body must arrive within this (408 otherwise), so a
            client sending it byte by byte holds nothing for long.
        queue_comment_seconds: a streaming request that asked for queue events
            (``x-fairq-queue-events: true``) gets an SSE comment with its position at once
            and a keep-alive comment at this interval while it stays queued.
        retry_after_seconds: ``Retry-After`` sent with 429 (queue caps) and 503.
        head_timeout_seconds: a request's line and headers must be complete this long after
            their first byte (408 and the connection closed otherwise).
        idle_timeout_seconds: a connection with no request in progress that sends nothing
            for this long is closed (new and kept-alive connections alike).
        max_connections: connections open on the door at most; one more is answered 503
            and closed.
        max_connections_per_peer: connections open from one peer address at most (behind a
            proxy every caller shares its address: raise it there).
        max_answer_chars: a non-streamed answer is built from the backend's stream; beyond
            this many characters of it the request is aborted and answered 400
            (``answer_too_large``). A streamed answer is bounded by
            ``limits.max_unread_chars`` instead (text the caller has not read).
        trusted_proxies: IP addresses and networks (``10.0.0.0/8``) of reverse proxies in
            front of the door whose ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` are
            believed (the console's ``Secure`` cookie, its origin and host checks); empty:
            nobody's, forwarded headers are ignored.

    """

    listen: str = ""
    body_timeout_seconds: float = 30.0
    queue_comment_seconds: float = 5.0
    retry_after_seconds: int = 1
    head_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 30.0
    max_connections: int = 1024
    max_connections_per_peer: int = 256
    max_answer_chars: int = 16_777_216
    trusted_proxies: tuple[str, ...] = ()


@functools.lru_cache(maxsize=8)
def parse_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """Return the networks of ``entries`` (an address is a network of one).

    Raises:
        ValueError: an entry is neither an IP address nor a network, naming it.

    """
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"{entry[:100]!r} is not an IP address or network (like 10.0.0.0/8)"
            ) from None
    return tuple(networks)


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
        read_usage: Envoy's Lua filter reads the backend's usage block from the tail of each
            response chunk (Envoy's CPU per chunk); false: it stops at the first chunk and
            fairq charges the tokens estimated from the response's bytes.

    """

    listen: str = "127.0.0.1:10000"
    admin_listen: str = ""
    replicas: tuple[str, ...] = ()
    message_timeout_seconds: float = 0.0
    connect_timeout_seconds: float = 0.25
    read_usage: bool = True
