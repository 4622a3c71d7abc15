"""What every backend adapter offers, and the HTTP plumbing they share.

Adapters translate one :class:`BackendRequest` into the backend's streaming HTTP API and its
answer into :class:`TextDelta` / :class:`StreamEnd` events. Foreign exceptions (aiohttp,
JSON) are translated at this boundary into :class:`~fairq_server.backends.errors.BackendError`,
which names what went wrong in the backend's terms; the API layer picks the gRPC status.

HTTP goes through aiohttp: its C parser hands a stream's buffered events over in one read,
where a pure-Python HTTP stack costs ~20 us of fairq's CPU per token event (measured with
vLLM's SSE framing, one chunk per token). That per-token cost is most of what a relay spends.
"""

from __future__ import annotations

import abc
import codecs
import functools
import json
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from fairq_server import loop_share
from fairq_server.backends.errors import BackendError, BackendFailure
from fairq_server.backends.sse import SseLimitError, aiter_sse_batches
from fairq_server.names import escape

__all__ = [
    "Backend",
    "BackendRequest",
    "MetricsSample",
    "ReadLimits",
    "Sampling",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
    "failure_for_http",
    "http_error",
    "read_at_most",
    "token_count",
]


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; None means "the backend's default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class BackendRequest:
    """One generation request, independent of the backend's API."""

    model: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    request_id: str = ""


@dataclass(frozen=True)
class TextDelta:
    """Generated text; ``tokens`` is how many tokens it carries as far as the API says."""

    text: str
    tokens: int = 1


@dataclass(frozen=True)
class StreamEnd:
    """The stream finished normally."""

    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


StreamEvent = TextDelta | StreamEnd


@dataclass(frozen=True)
class MetricsSample:
    """The values fairq reads from a backend's ``/metrics`` (cumulative where counters).

    Attributes:
        waiting: requests in the backend's queue.
        running: requests being processed.
        kv_usage: KV-cache usage 0-1, if reported.
        tpot_sum: cumulative seconds of the time-per-output-token histogram.
        tpot_count: cumulative count of that histogram.

    """

    waiting: float
    running: float
    kv_usage: float | None = None
    tpot_sum: float = 0.0
    tpot_count: float = 0.0


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


_FAILURE_BY_HTTP: dict[int, BackendFailure] = {
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
    kind = _FAILURE_BY_HTTP.get(status)
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


class Backend(abc.ABC):
    """An inference backend reachable over HTTP.

    Attributes:
        id: unique id used in routing, logs and metrics.
        kind: "vllm" or "tgi".
        base_url: e.g. ``http://127.0.0.1:8000``.
        models: models this backend serves.
        priority_scheduling: the backend orders its queue by the request's priority.

    """

    kind: str = ""

    def __init__(
        self,
        id: str,
        base_url: str,
        models: Sequence[str],
        *,
        priority_scheduling: bool = False,
        max_in_flight: int = 0,
        timeout: float = 600.0,
        read_limits: ReadLimits | None = None,
    ) -> None:
        self.id = id
        self.base_url = base_url.rstrip("/")
        self.models = tuple(models)
        self.priority_scheduling = priority_scheduling
        self.max_in_flight = max_in_flight
        self.read_limits = read_limits if read_limits is not None else ReadLimits()
        # No read timeout on streams beyond `timeout`: a long generation legitimately stays
        # silent while the backend queues it, but connecting must be quick.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        """Return the connection pool, made on first use (it belongs to the running loop).

        No limit on connections: the gate decides how many requests a backend gets, and every
        stream holds its connection until it ends.
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=_tls_context()),
                timeout=self._timeout,
            )
        return self._session

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._session is not None:
            await self._session.close()

    async def scrape(self, timeout: float) -> MetricsSample:
        """Fetch and parse ``/metrics`` within ``timeout`` seconds, headers to last byte.

        Raises:
            BackendError: the endpoint failed, took too long, sent more than
                ``read_limits.metrics_bytes``, or its text could not be parsed (or held a
                NaN, infinite or negative value).

        """
        limit = self.read_limits.metrics_bytes
        try:
            async with self._http().get(
                f"{self.base_url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    raise await self.http_error(resp)
                body, complete = await read_at_most(resp, limit)
                if not complete:
                    # Do not read the rest: closing drops the connection with it.
                    resp.close()
                    raise BackendError(
                        f"backend {self.id}: metrics larger than {limit} bytes "
                        "(scheduler.max_metrics_bytes)",
                        BackendFailure.UNAVAILABLE,
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(
                f"backend {self.id}: metrics unreachable: {escape(repr(exc), 300)}",
                BackendFailure.UNAVAILABLE,
            ) from exc
        try:
            return self.parse_metrics(body.decode("utf-8", "replace"))
        except ValueError as exc:
            raise BackendError(
                f"backend {self.id}: unreadable metrics: {escape(str(exc), 300)}",
                BackendFailure.UNAVAILABLE,
            ) from exc

    async def http_error(self, resp: aiohttp.ClientResponse) -> BackendError:
        """Return the error for a non-200 answer, reading at most a prefix of its body."""
        body, complete = await read_at_most(resp, self.read_limits.error_bytes)
        if not complete:
            resp.close()  # the rest is never read; the connection goes with it
        return http_error(self.id, resp.status, body)

    @abc.abstractmethod
    def parse_metrics(self, text: str) -> MetricsSample:
        """Read a :class:`MetricsSample` from Prometheus exposition text."""

    @abc.abstractmethod
    def stream(self, request: BackendRequest, priority: int) -> AsyncGenerator[StreamEvent]:
        """Stream the generation of ``request``.

        Closing the iterator early closes the HTTP stream, which makes the backend abort the
        request. ``priority`` is passed on only where the backend schedules by it.
        """

    async def _sse(
        self, path: str, payload: dict[str, Any]
    ) -> AsyncGenerator[list[dict[str, Any]]]:
        """POST ``payload``; yield the JSON objects of each network read until ``[DONE]``/EOF."""
        headers = {"accept": "text/event-stream"}
        try:
            async with self._http().post(
                f"{self.base_url}{path}", json=payload, headers=headers
            ) as resp:
                if resp.status != 200:
                    raise await self.http_error(resp)
                async for batch in aiter_sse_batches(_utf8(resp.content)):
                    objects: list[dict[str, Any]] = []
                    for data in batch:
                        if data == "[DONE]":
                            if objects:
                                yield objects
                            return
                        objects.append(self._decode(data))
                    yield objects
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(
                f"backend {self.id}: connection failed: {exc!r}",
                BackendFailure.UNAVAILABLE,
                retryable=True,
            ) from exc
        except SseLimitError as exc:
            # Leaving the `async with` above has closed the stream: the backend aborts.
            raise BackendError(
                f"backend {self.id}: malformed stream: a line or event exceeds the limit of "
                f"{exc.limit} characters",
                BackendFailure.FAILED,
            ) from exc

    def shape_error(self, obj: object) -> BackendError:
        """Return the error for a stream event that is JSON but not shaped as the API says.

        The message quotes the event (escaped, shortened), never the Python exception its
        reading raised: that is fairq's business, not the caller's.
        """
        return BackendError(
            f"backend {self.id}: unexpected stream event {escape(repr(obj), 200)}",
            BackendFailure.FAILED,
        )

    def unfinished(self) -> BackendError:
        """Return the error for a stream that ended without saying it was complete."""
        return BackendError(
            f"backend {self.id} ended the stream before the generation finished",
            BackendFailure.UNAVAILABLE,
        )

    def _decode(self, data: str) -> dict[str, Any]:
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise BackendError(
                f"backend {self.id}: malformed stream event: {data[:200]!r}",
                BackendFailure.FAILED,
            ) from exc
        if not isinstance(obj, dict):
            raise BackendError(
                f"backend {self.id}: unexpected stream event: {data[:200]!r}",
                BackendFailure.FAILED,
            )
        err = obj.get("error")
        if err:
            raise self._error_event(err, obj.get("error_type"))
        return obj

    def _error_event(self, err: object, error_type: object) -> BackendError:
        """Translate an error sent as a stream event.

        vLLM (and OpenAI-compatible servers) nest an HTTP status (``code``) in the error
        object; adapters whose backend names error kinds otherwise override this.
        """
        status: object = None
        if isinstance(err, dict):
            message = str(err.get("message", err))
            status = err.get("code", err.get("http_status_code"))
        else:
            message = str(err)
        kind, retryable = BackendFailure.FAILED, False
        if isinstance(status, int) and not isinstance(status, bool):
            kind = _FAILURE_BY_HTTP.get(status, BackendFailure.FAILED)
            retryable = status == 429 or status >= 500
        return BackendError(
            f"backend {self.id} failed: {escape(message, 1000)}", kind, retryable=retryable
        )


async def _utf8(body: aiohttp.StreamReader) -> AsyncIterator[str]:
    """Yield the body as text, one piece per network read (all that arrived by then)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    async for chunk in body.iter_any():
        # Parsing and relaying what arrived is bulk work: every stream of a backend gets its
        # token in the same instant (one engine step), so reads come in bursts.
        await loop_share.turn()
        if text := decoder.decode(chunk):
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


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


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every backend: building one loads the CA store (~25 ms)."""
    return ssl.create_default_context()
