"""What the doors accept: request bounds (``[limits]``), TLS (``[tls]``), the HTTP door.

Part of the configuration (:mod:`fairq_server.config.schema` re-exports every name);
kept apart so each module stays one concept of a readable size.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Float, Int, Str, doc, section

__all__ = ["HttpConfig", "Network", "RequestBounds", "TlsConfig", "parse_networks"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@section
@dataclass(frozen=True)
class RequestBounds:
    """Bounds on request input (larger requests get INVALID_ARGUMENT) and on buffering."""

    max_prompt_chars: Annotated[
        Int, doc("characters of prompt (or messages) per request", gt=0)
    ] = 1_000_000
    max_messages: Annotated[Int, doc("messages per chat request", gt=0)] = 1_000
    max_tokens: Annotated[Int, doc("largest output bound a request may ask for", gt=0)] = 32_768
    max_stop_strings: Annotated[Int, doc("stop strings per request", ge=0)] = 4
    max_stop_chars: Annotated[Int, doc("characters of one stop string", ge=0)] = 1_000
    max_metadata_bytes: Annotated[
        Int, doc("gRPC metadata (headers) per call; fixed when the gRPC server is built", gt=0)
    ] = 16_384
    max_unread_chars: Annotated[
        Int,
        doc(
            "generated text held for a caller that does not read it; past this, the request "
            "ends with RESOURCE_EXHAUSTED and its backend request is aborted",
            gt=0,
        ),
    ] = 1_000_000
    max_extra_bytes: Annotated[
        Int,
        doc(
            "pass-through parameters (the gRPC ``extra`` Struct, the fields of an HTTP body "
            "fairq does not interpret), as compact JSON",
            ge=0,
        ),
    ] = 262_144
    max_extra_depth: Annotated[Int, doc("nesting depth of the pass-through parameters", gt=0)] = 32
    max_body_bytes: Annotated[Int, doc("an HTTP request body (413 above it)", gt=0)] = 8_388_608
    max_streams_per_connection: Annotated[
        Int,
        doc(
            "HTTP/2 ``MAX_CONCURRENT_STREAMS`` advertised to gRPC clients; a queued request "
            "holds its stream: keep it at or above ``scheduler.max_queued_per_user``",
            gt=0,
        ),
    ] = 10_000
    max_grpc_connections: Annotated[Int, doc("connections open on the gRPC port at most", gt=0)] = (
        4096
    )
    request_receive_seconds: Annotated[
        Float,
        doc(
            "a call whose complete request message has not arrived this long after the call "
            "opened is answered DEADLINE_EXCEEDED and its stream freed",
            gt=0,
        ),
    ] = 10.0
    default_max_tokens: Annotated[
        Int,
        doc(
            "the output bound sent for a request that gives none (0: ``max_tokens`` itself), "
            "so a backend's own default never applies",
            ge=0,
        ),
    ] = 0
    max_sequences: Annotated[
        Int,
        doc(
            "the largest ``n`` / ``best_of`` passed through to the engine, generated in the one "
            "backend slot fairq admitted the request to",
            gt=0,
        ),
    ] = 1
    max_prompts: Annotated[
        Int,
        doc(
            "the longest list of prompts one completions request may carry; each prompt is "
            "scheduled as its own request",
            gt=0,
        ),
    ] = 64
    max_choices: Annotated[
        Int,
        doc(
            "the largest ``n`` of an HTTP request; each choice is scheduled as its own request "
            "(its own backend slot, charged to the caller)",
            gt=0,
        ),
    ] = 16


@section
@dataclass(frozen=True)
class TlsConfig:
    """TLS for the gRPC port; with ``client_ca_file``, clients must present a certificate."""

    cert_file: Annotated[Str, doc("PEM certificate chain of the server")]
    key_file: Annotated[Str, doc("PEM private key of the server")]
    client_ca_file: Annotated[Str, doc("PEM CA bundle; when set, mutual TLS is required")] = ""


@section
@dataclass(frozen=True)
class HttpConfig:
    """The OpenAI-compatible HTTP door (``/v1/chat/completions``, ``/v1/completions``)."""

    listen: Annotated[Str, doc("``host:port`` to serve on; empty: the door is off")] = ""
    body_timeout_seconds: Annotated[
        Float, doc("a request body must arrive within this (408 otherwise)", gt=0)
    ] = 30.0
    queue_comment_seconds: Annotated[
        Float,
        doc(
            "a streaming request that asked for queue events gets a keep-alive SSE comment "
            "with its position at this interval while it stays queued",
            gt=0,
        ),
    ] = 5.0
    retry_after_seconds: Annotated[
        Int, doc("``Retry-After`` sent with 429 (queue caps) and 503", ge=0)
    ] = 1
    head_timeout_seconds: Annotated[
        Float,
        doc(
            "a request's line and headers must be complete this long after their first byte "
            "(408 and the connection closed otherwise)",
            gt=0,
        ),
    ] = 10.0
    idle_timeout_seconds: Annotated[
        Float,
        doc(
            "a connection with no request in progress that sends nothing for this long is closed",
            gt=0,
        ),
    ] = 30.0
    max_connections: Annotated[
        Int, doc("connections open on the door at most; one more is answered 503", gt=0)
    ] = 1024
    max_connections_per_peer: Annotated[
        Int,
        doc("connections open from one peer address at most (raise it behind a proxy)", gt=0),
    ] = 256
    max_answer_chars: Annotated[
        Int,
        doc(
            "a non-streamed answer beyond this many characters is aborted and answered 400 "
            "(a streamed one is bounded by ``limits.max_unread_chars``)",
            gt=0,
        ),
    ] = 16_777_216
    trusted_proxies: Annotated[
        tuple[Str, ...],
        doc(
            "IP addresses and networks of reverse proxies whose ``X-Forwarded-Proto`` and "
            "``X-Forwarded-Host`` are believed (empty: nobody's)"
        ),
    ] = ()


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
