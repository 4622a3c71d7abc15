"""Reading backends' HTTP answers within bounds, and translating their errors.

Every byte fairq reads from a backend outside a generation stream is bounded
(:class:`ReadLimits`); an HTTP error becomes a :class:`~fairq_server.errors.BackendError`
that keeps the backend's own message; token counts are validated before fairq charges them.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from fairq_server.backends.idle_watch import STREAM_TIMEOUT, IdleWatch
from fairq_server.backends.sse import SseLimitError, SseSplitter
from fairq_server.errors import BackendError, BackendFailure
from fairq_server.names import escape
from fairq_server.runtime.loop_share import LoopShare

__all__ = [
    "FAILURE_BY_HTTP",
    "ReadLimits",
    "describe_failure",
    "failure_for_http",
    "http_error",
    "posted",
    "read_at_most",
    "sse_reads",
    "stream_failures",
    "token_count",
    "utf8_chunks",
]


@dataclass(frozen=True)
class ReadLimits:
    """How much fairq reads from a backend outside a generation stream.

    Attributes:
        metrics_bytes: a ``/metrics`` body longer than this fails the scrape.
        error_bytes: at most this prefix of an HTTP error body is read.

    """

    metrics_bytes: int = 4 * 1024 * 1024
    error_bytes: int = 16_384


async def read_at_most(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Read up to ``limit`` bytes of ``resp``'s body; return them and whether that was all.

    Reading stops at the limit: the rest is never buffered. A declared ``Content-Length``
    over the limit is not read at all.
    """
    if resp.content_length is not None and resp.content_length > limit:
        return b"", False
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(65_536):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(parts)[:limit], False
    return b"".join(parts), True


#: The failure kind of each HTTP status that names one (5xx and others: see failure_for_http).
FAILURE_BY_HTTP: dict[int, BackendFailure] = {
    400: BackendFailure.INVALID_REQUEST,
    404: BackendFailure.NOT_FOUND,
    413: BackendFailure.INVALID_REQUEST,
    415: BackendFailure.INVALID_REQUEST,
    422: BackendFailure.INVALID_REQUEST,
    424: BackendFailure.FAILED,
    429: BackendFailure.OVERLOADED,
}


def failure_for_http(status: int) -> tuple[BackendFailure, bool]:
    """Return the failure kind of an HTTP error status, and whether another backend may help."""
    kind = FAILURE_BY_HTTP.get(status)
    if kind is not None:
        return kind, status == 429
    if status >= 500:
        return BackendFailure.UNAVAILABLE, True
    return BackendFailure.FAILED, True


def http_error(backend_id: str, status: int, body: bytes) -> BackendError:
    """Translate a backend's HTTP error answer into a :class:`BackendError`.

    The backend's own message is kept: vLLM nests it as ``{"error": {"message": ...}}``,
    TGI sends ``{"error": "...", "error_type": ...}``, and either may answer in plain text.
    """
    message = body.decode(errors="replace").strip()
    try:
        doc = json.loads(message)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("message"))
        if isinstance(err, dict):
            err = err.get("message")
        if isinstance(err, str):
            message = err
    kind, retryable = failure_for_http(status)
    return BackendError(
        f"backend {backend_id} answered HTTP {status}: {escape(message, 1000)}",
        kind,
        retryable=retryable,
    )


async def utf8_chunks(body: aiohttp.StreamReader, share: LoopShare) -> AsyncIterator[str]:
    """Yield the body as text, one piece per network read (all that arrived by then).

    Each read takes a turn of bulk work on ``share`` (the loop's) before it is decoded.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    urgent = True  # the first read carries the first token
    turn = share.turn  # bound once: taken per read
    try:
        async for chunk in body.iter_any():
            # Parsing and relaying what arrived is bulk work: every stream of a backend gets
            # its token in the same instant (one engine step), so reads come in bursts.
            await turn(urgent)
            urgent = False
            if text := decoder.decode(chunk):
                yield text
    except aiohttp.ClientError:
        # aiohttp raises a lost connection's error before handing over what had arrived
        # before the loss (its reader checks for an error first): tokens the backend sent
        # and the caller is owed. They are read from its buffer, then the error goes on.
        if text := decoder.decode(_unread(body), final=True):
            yield text
        raise
    if tail := decoder.decode(b"", final=True):
        yield tail


async def sse_reads(
    body: aiohttp.StreamReader, share: LoopShare, idle: float | None = None
) -> AsyncGenerator[list[str]]:
    """Yield the ``data`` payloads of the server-sent events each network read completed.

    :func:`utf8_chunks` and :class:`~fairq_server.backends.sse.SseSplitter` in one loop: every
    read of every stream passes here, and each generator layer a read goes through costs a
    resumption (docs/design/hot-path.md). With ``idle``, the stream fails after that many
    seconds without data (:class:`~fairq_server.backends.idle_watch.IdleWatch`). Each read
    takes a turn of bulk work on ``share`` (the loop's), as in :func:`utf8_chunks`.

    Raises:
        SseLimitError: a line or an event is longer than the limit.
        aiohttp.ClientError: the connection was lost (after the events that had arrived), or
            nothing came for ``idle`` seconds.

    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    splitter = SseSplitter()
    urgent = True
    watch = IdleWatch(body, idle) if idle else None
    turn = share.turn  # bound once: taken per read
    try:
        async for chunk in body.iter_any():
            if watch is not None:
                watch.read()
            await turn(urgent)  # bulk work, as in utf8_chunks
            urgent = False
            if batch := splitter.feed(decoder.decode(chunk)):
                yield batch
                splitter.check()
    except aiohttp.ClientError:
        # As in utf8_chunks: the events that arrived before the loss are owed to the caller
        # (an unterminated last one is not: the stream did not end, it broke).
        if batch := splitter.feed(decoder.decode(_unread(body), final=True)):
            yield batch
        raise
    finally:
        if watch is not None:
            watch.close()
    if batch := splitter.feed(decoder.decode(b"", final=True)):
        yield batch
    if batch := splitter.end():
        yield batch


def _unread(body: aiohttp.StreamReader) -> bytes:
    """Return what ``body`` holds unread, though an error was set on it (aiohttp's own read)."""
    try:
        return body._read_nowait(-1)
    except Exception:  # another aiohttp's internals: the text is lost, as before
        return b""


def token_count(value: object) -> int:
    """Read a token count from a backend's JSON: a whole number 0 <= n < 2**31 (None is 0).

    Raises:
        ValueError: anything else (negative, fractional, NaN, infinite, a string, a bool).

    """
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError(f"token count {value!r} is not a whole number in [0, 2**31)")
    return value


def usage_tokens(event: Mapping[str, Any], prompt: int, completion: int) -> tuple[int, int]:
    """Return the prompt and completion token counts of ``event``'s usage, else those given.

    Raises:
        ValueError: a count that is not a whole number 0 <= n < 2**31 (see :func:`token_count`).

    """
    usage = event.get("usage")
    if not usage:
        return prompt, completion
    return token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))


@contextlib.asynccontextmanager
async def posted(
    session: aiohttp.ClientSession, url: str | URL, idle: float | None = None, **kwargs: Any
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST to ``url``; inside, the response (its headers read). Leaving it releases it.

    With ``idle`` (a generation stream, read with :func:`sse_reads` and the same ``idle``),
    the answer's headers must come within that many seconds, and no per-read timeout is set
    on the body (:mod:`~fairq_server.backends.idle_watch`); a wait longer than ``idle``
    raises :class:`TimeoutError`.

    A pooled connection the backend closed while it sat idle fails the request's write
    ("Can not write request body") or drops before any answer. The request is sent once
    more at once, on another connection, instead of counting as the backend's failure (which
    would retry it elsewhere and pause the backend until its next scrape): in the first case
    the backend never saw it, and in the second a backend that read it aborts it with the
    dropped connection, as it does for any caller that leaves. A connection that cannot be
    made at all is not retried here.
    """
    if idle:
        kwargs["timeout"] = STREAM_TIMEOUT
    for attempt in range(2):
        try:
            async with asyncio.timeout(idle):
                resp = await session.post(url, **kwargs)
            break
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if attempt or isinstance(exc, aiohttp.ClientConnectorError):
                raise
    async with resp:  # leaving it unread closes the connection: the backend aborts
        yield resp


def describe_failure(exc: BaseException) -> str:
    """Return why an HTTP exchange with a backend failed, in one line an operator can act on.

    aiohttp's exceptions print as nested Python reprs (``ClientConnectorError(ConnectionKey(
    host='127.0.0.1', port=1, is_ssl=False, ssl=True, proxy=None, ...``); what matters is
    where fairq tried to go and what the system said: "cannot connect to 127.0.0.1:1:
    Connection refused". Escaped and bounded, as everything fairq logs of a backend's.
    """
    return escape(_describe(exc), 300)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):  # fairq's own timeouts say which wait ran out
        return " ".join(str(exc).split()) or "no answer in time"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate of {exc.host}:{exc.port} refused: {exc.certificate_error}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect to {exc.host}:{exc.port}: {_os_reason(exc.os_error)}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the backend closed the connection"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status} {exc.message}".strip()
    text = " ".join(str(exc).split())  # one line, whatever the library put in it
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _os_reason(error: OSError) -> str:
    """Return the system's words for ``error`` ("Connection refused", "Name or service ...")."""
    if isinstance(error, socket.gaierror) and error.strerror:
        return error.strerror
    if error.errno is not None and error.errno > 0:
        # asyncio words a refused connect "Connect call failed (...)"; the errno says which.
        return os.strerror(error.errno)
    return " ".join((error.strerror or str(error) or type(error).__name__).split())


@contextlib.contextmanager
def stream_failures(backend_id: str, url: object = None) -> Iterator[None]:
    """Translate what reading a generation stream inside raises into :class:`BackendError`.

    A failed connection (or a timeout) is retryable; an event over the reader's limit is a
    malformed stream. Leaving the stream's ``async with`` (inside) has closed it by then, so
    the backend aborts the request.
    """
    try:
        yield
    except (aiohttp.ClientError, TimeoutError) as exc:
        at = f" at {escape(str(url), 300)}" if url is not None else ""
        raise BackendError(
            f"backend {backend_id}: request failed{at}: {describe_failure(exc)}",
            BackendFailure.UNAVAILABLE,
            retryable=True,
        ) from exc
    except SseLimitError as exc:
        raise BackendError(
            f"backend {backend_id}: malformed stream: a line or event exceeds the limit of "
            f"{exc.limit} characters",
            BackendFailure.FAILED,
        ) from exc
