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
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import aiohttp

from fairq_server import loop_share
from fairq_server.backends.errors import BackendError, BackendFailure
from fairq_server.backends.sse import SseLimitError, aiter_sse_batches
from fairq_server.errors import InvalidRequestError

if TYPE_CHECKING:
    from fairq_server.config import BackendConfig

__all__ = [
    "Backend",
    "BackendRequest",
    "MetricsSample",
    "Sampling",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
    "failure_for_http",
    "http_error",
    "openai_body",
    "utf8_chunks",
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
    """One generation request, independent of the backend's API.

    Attributes:
        model: the model name.
        prompt: the prompt (completions), or None for chat.
        messages: ``(role, text)`` of each chat message: what fairq estimates and hashes.
        sampling: the parameters fairq validates itself.
        request_id: the caller's or a generated id.
        extra: parameters fairq passes through without interpreting them (tools,
            ``response_format``, ``logprobs``, ``n``, penalties, engine options), merged
            into the backend's JSON body under fairq's own fields.
        raw_messages: the chat messages exactly as the caller sent them (content parts,
            ``tool_calls``, ``tool_call_id``); sent instead of ``messages`` when set.
        relay_chunks: stream the backend's OpenAI chunks as they came, framed as SSE, in
            each delta's text (the HTTP door), instead of the generated text (gRPC).
        relay_usage: with ``relay_chunks``, keep the final usage chunk (the caller asked
            for it too).

    """

    model: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    request_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    raw_messages: tuple[Mapping[str, Any], ...] | None = None
    relay_chunks: bool = False
    relay_usage: bool = False


@dataclass(frozen=True)
class TextDelta:
    """Generated output; ``tokens`` is how many tokens it carries as far as the API says.

    An event with ``tokens == 0`` (an opening role-only chunk) is relayed but is not the
    first token. ``extra`` holds what the backend sent beside text (tool calls, logprobs),
    one object per choice event, in order.
    """

    text: str
    tokens: int = 1
    extra: tuple[Mapping[str, Any], ...] = ()


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


def openai_body(request: BackendRequest) -> tuple[str, dict[str, Any]]:
    """Return the path and streaming JSON body of ``request`` for an OpenAI-compatible API.

    Pass-through parameters go in first; fairq's own fields are set over them: the model,
    the input, ``stream`` (fairq always streams from the backend, to see the first token),
    usage in the stream (fairq charges tokens by it; a caller's other ``stream_options``
    are kept) and the validated sampling parameters.
    """
    s = request.sampling
    body: dict[str, Any] = dict(request.extra)
    options = body.get("stream_options")
    body["model"] = request.model
    body["stream"] = True
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    if request.messages is not None:
        path = "/v1/chat/completions"
        body["messages"] = (
            [dict(m) for m in request.raw_messages]
            if request.raw_messages is not None
            else [{"role": r, "content": c} for r, c in request.messages]
        )
    else:
        path = "/v1/completions"
        body["prompt"] = request.prompt
    optional = {
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "ignore_eos": s.ignore_eos or None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return path, body


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
        f"backend {backend_id} answered HTTP {status}: {message[:1000]}", kind, retryable=retryable
    )


class Backend(abc.ABC):
    """An inference backend reachable over HTTP.

    Attributes:
        id: unique id used in routing, logs and metrics.
        kind: "vllm" or "tgi".
        base_url: e.g. ``http://127.0.0.1:8000``.
        models: models this backend serves.
        priority_scheduling: the backend orders its queue by the request's priority.
        fair_share_priority: the priority sent also encodes the user's fair standing on this
            backend (only with ``priority_scheduling``; the dispatcher decides the value).

    """

    kind: str = ""

    def __init__(
        self,
        id: str,
        base_url: str,
        models: Sequence[str],
        *,
        priority_scheduling: bool = False,
        fair_share_priority: bool = False,
        max_in_flight: int = 0,
        timeout: float = 600.0,
        api_key: str | None = None,
        verify_models: bool = False,
    ) -> None:
        self.id = id
        self.base_url = base_url.rstrip("/")
        self.models = tuple(models)
        self.priority_scheduling = priority_scheduling
        self.fair_share_priority = fair_share_priority
        self.max_in_flight = max_in_flight
        # No read timeout on streams beyond `timeout`: a long generation legitimately stays
        # silent while the backend queues it, but connecting must be quick.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        # Until /v1/models has listed every registered model, scrapes check it first (and
        # fail with the reason, which keeps the backend unhealthy).
        self.models_verified = not verify_models

    @classmethod
    def from_config(cls, cfg: BackendConfig, *, timeout: float, from_rpc: bool = False) -> Self:
        """Build the adapter of ``cfg`` (its URL and models are already validated).

        Raises:
            InvalidRequestError: the API key cannot be read, or a setting does not apply.

        """
        from fairq_server.backends.credentials import read_api_key

        return cls(
            cfg.id,
            cfg.base_url,
            cfg.models,
            priority_scheduling=cfg.priority_scheduling,
            fair_share_priority=cfg.fair_share_priority,
            max_in_flight=cfg.max_in_flight,
            timeout=timeout,
            api_key=read_api_key(cfg, from_rpc=from_rpc),
            verify_models=cfg.verify_models,
        )

    def _http(self) -> aiohttp.ClientSession:
        """Return the connection pool, made on first use (it belongs to the running loop).

        No limit on connections: the gate decides how many requests a backend gets, and every
        stream holds its connection until it ends. The backend's API key, if any, goes with
        every request.
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=_tls_context()),
                timeout=self._timeout,
                headers=self._headers,
            )
        return self._session

    def session(self) -> aiohttp.ClientSession:
        """Return the backend's HTTP connection pool (with its credentials)."""
        return self._http()

    async def verify_models(self, timeout: float = 5.0) -> None:
        """Check that ``/v1/models`` lists every registered model.

        A backend without the endpoint (404) is taken at its registration's word.

        Raises:
            InvalidRequestError: the backend answered and does not serve a registered model.
            BackendError: the backend could not be asked (unreachable, refused the key).

        """
        from fairq_server.backends.credentials import check_served_models

        await check_served_models(self, timeout)
        self.models_verified = True

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._session is not None:
            await self._session.close()

    async def scrape(self, timeout: float) -> MetricsSample:
        """Fetch and parse ``/metrics``.

        Raises:
            BackendError: the endpoint failed or its text could not be parsed, or the
                backend does not (yet) list the models it is registered for.

        """
        if not self.models_verified:
            try:
                await self.verify_models(timeout)
            except InvalidRequestError as exc:
                raise BackendError(str(exc), BackendFailure.UNAVAILABLE) from exc
        try:
            async with self._http().get(
                f"{self.base_url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendError(
                f"backend {self.id}: metrics unreachable: {exc!r}", BackendFailure.UNAVAILABLE
            ) from exc
        if resp.status != 200:
            raise http_error(self.id, resp.status, body)
        try:
            return self.parse_metrics(body.decode("utf-8", "replace"))
        except ValueError as exc:
            raise BackendError(
                f"backend {self.id}: unreadable metrics: {exc}", BackendFailure.UNAVAILABLE
            ) from exc

    @abc.abstractmethod
    def parse_metrics(self, text: str) -> MetricsSample:
        """Read a :class:`MetricsSample` from Prometheus exposition text."""

    def openai_payload(self, request: BackendRequest, priority: int) -> tuple[str, dict[str, Any]]:
        """Return the path and body of ``request`` on the backend's OpenAI-compatible API."""
        return openai_body(request)

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
                    raise http_error(self.id, resp.status, await resp.read())
                async for batch in aiter_sse_batches(utf8_chunks(resp.content)):
                    objects: list[dict[str, Any]] = []
                    for data in batch:
                        if data == "[DONE]":
                            if objects:
                                yield objects
                            return
                        objects.append(self.decode_event(data))
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

    def shape_error(self, obj: object, exc: Exception | None = None) -> BackendError:
        """Return the error for a stream event that is JSON but not shaped as the API says."""
        return BackendError(
            f"backend {self.id}: unexpected stream event {str(obj)[:200]!r}"
            + (f" ({type(exc).__name__}: {exc})" if exc else ""),
            BackendFailure.FAILED,
        )

    def unfinished(self) -> BackendError:
        """Return the error for a stream that ended without saying it was complete."""
        return BackendError(
            f"backend {self.id} ended the stream before the generation finished",
            BackendFailure.UNAVAILABLE,
        )

    def decode_event(self, data: str) -> dict[str, Any]:
        """Parse one SSE payload into a JSON object; an error event raises its error."""
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
        return BackendError(f"backend {self.id} failed: {message}", kind, retryable=retryable)


async def utf8_chunks(body: aiohttp.StreamReader) -> AsyncIterator[str]:
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


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every backend: building one loads the CA store (~25 ms)."""
    return ssl.create_default_context()
