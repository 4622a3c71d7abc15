"""What every backend adapter offers, and the HTTP plumbing they share.

Adapters translate one :class:`BackendRequest` into the backend's streaming HTTP API and its
answer into :class:`TextDelta` / :class:`StreamEnd` events. Foreign exceptions (aiohttp,
JSON) are translated at this boundary into :class:`~fairq_server.errors.BackendError`,
which names what went wrong in the backend's terms; the API layer picks the gRPC status.

HTTP goes through aiohttp: its C parser hands a stream's buffered events over in one read,
where a pure-Python HTTP stack costs ~20 us of fairq's CPU per token event (measured with
vLLM's SSE framing, one chunk per token). That per-token cost is most of what a relay spends.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Self

import aiohttp
import orjson
import yarl

from fairq_server.backends.continuation import resumed_usage
from fairq_server.backends.credentials import check_served_models, read_api_key
from fairq_server.backends.http_reading import (
    FAILURE_BY_HTTP,
    ReadLimits,
    http_error,
    posted,
    read_at_most,
    sse_reads,
    stream_failures,
)
from fairq_server.backends.idle_watch import CONNECT_SECONDS
from fairq_server.backends.metrics import MetricsScraper
from fairq_server.backends.openai_wire import STREAM_HEADERS, json_body, openai_body
from fairq_server.backends.request import (
    BackendRequest,
    MetricsSample,
    StreamEnd,
    StreamEvent,
)
from fairq_server.errors import BackendError, BackendFailure, InvalidRequestError
from fairq_server.names import escape
from fairq_server.runtime.loop_share import LoopShare

if TYPE_CHECKING:
    from fairq_server.config.backends import BackendConfig

__all__ = ["Backend"]


#: Seconds an idle connection to a backend is kept for reuse. vLLM's server (uvicorn) and
#: llama.cpp's close a connection idle for 5 s; reusing one at that moment fails the request's
#: write ("Can not write request body"), costing it a retry. Closing first avoids the race.
KEEPALIVE_SECONDS = 4.0


class Backend(abc.ABC):
    """An inference backend reachable over HTTP.

    Attributes:
        id: unique id used in routing, logs and metrics.
        kind: "vllm", "tgi" or "openai".
        token_prompts: the backend's completions API takes a prompt as token ids.
        base_url: e.g. ``http://127.0.0.1:8000``.
        models: models this backend serves.
        priority_scheduling: the backend orders its queue by the request's priority.
        fair_share_priority: the priority sent also encodes the user's fair standing on this
            backend (only with ``priority_scheduling``; the dispatcher decides the value).
        preempt: fairq may preempt requests running here (``docs/design/preemption.md``).
        continues_by_ids, continues_chat: how a preempted request continues here (class
            attributes, per adapter; ``backends/continuation.py``).

    """

    kind: str = ""
    token_prompts: bool = False
    #: A preempted completions request continues by the token ids of its prompt and output
    #: (the engine returns and accepts them): exact, and its input's length is known.
    continues_by_ids: bool = False
    #: A preempted chat request can continue (its output as a final assistant message).
    continues_chat: bool = True
    #: Sample names the adapter reads, asked for by name (``name[]``, as prometheus_client's
    #: exporter filters) at :attr:`filtered_metrics_path`; empty: ``/metrics`` whole.
    metrics_filter: tuple[str, ...] = ()
    filtered_metrics_path: str = "/metrics/"

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
        read_limits: ReadLimits | None = None,
        preempt: bool = False,
    ) -> None:
        self.id = id
        self.preempt = preempt
        self.base_url = base_url.rstrip("/")
        self.models = tuple(models)
        self.priority_scheduling = priority_scheduling
        self.fair_share_priority = fair_share_priority
        self.max_in_flight = max_in_flight
        self.read_limits = read_limits if read_limits is not None else ReadLimits()
        # No read timeout on streams beyond `timeout`: a long generation legitimately stays
        # silent while the backend queues it, but connecting must be quick.
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_SECONDS, sock_read=timeout
        )
        #: Generation streams fail after this many seconds without data (idle_watch).
        self.read_timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._urls: dict[str, yarl.URL] = {}
        # Until /v1/models has listed every registered model, scrapes check it first (and
        # fail with the reason, which keeps the backend unhealthy).
        self.models_verified = not verify_models
        self._scraper: MetricsScraper | None = None
        # Each model's context length, as /v1/models gave it (read with the check).
        self.context_lengths: dict[str, int] = {}
        #: Where the stream's reads take their turns of bulk work: the loop's share, given
        #: when the adapter is registered (:meth:`FairqCore.register_backend`); an adapter
        #: used on its own shares the loop only among its own streams.
        self.loop_share = LoopShare()

    @classmethod
    def from_config(
        cls,
        cfg: BackendConfig,
        *,
        timeout: float,
        from_rpc: bool = False,
        read_limits: ReadLimits | None = None,
    ) -> Self:
        """Build the adapter of ``cfg`` (its URL and models are already validated).

        Raises:
            InvalidRequestError: the API key cannot be read, or a setting does not apply.

        """
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
            read_limits=read_limits,
            preempt=cfg.preempt,
            **cls.kind_options(cfg),
        )

    @classmethod
    def kind_options(cls, cfg: BackendConfig) -> dict[str, Any]:
        """Return the constructor arguments of this kind beyond the common ones (none here)."""
        return {}

    def _http(self) -> aiohttp.ClientSession:
        """Return the connection pool, made on first use (it belongs to the running loop).

        No limit on connections: the gate decides how many requests a backend gets, and every
        stream holds its connection until it ends. The backend's API key, if any, goes with
        every request. An idle connection is kept for less time than the engines keep theirs
        (see :data:`KEEPALIVE_SECONDS`).
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, ssl=_tls_context(), keepalive_timeout=KEEPALIVE_SECONDS
                ),
                timeout=self._timeout,
                headers=self._headers,
            )
        return self._session

    def url(self, path: str) -> yarl.URL:
        """Return the URL of ``path`` (one of the adapter's few) on the backend, parsed once.

        Every generation request is set up on the loop: a parsed URL saves aiohttp parsing
        the string again each time (docs/design/hot-path.md).
        """
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = yarl.URL(f"{self.base_url}{path}")
        return url

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
        self.context_lengths = await check_served_models(self, timeout)
        self.models_verified = True

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        if self._session is not None:
            await self._session.close()

    async def scrape(self, timeout: float) -> MetricsSample:
        """Fetch and parse ``/metrics`` within ``timeout`` seconds, headers to last byte.

        An adapter with :attr:`metrics_filter` asks for those samples only, until the
        backend proves it cannot answer that (:class:`MetricsScraper`).

        Raises:
            BackendError: the endpoint failed, took too long, sent more than
                ``read_limits.metrics_bytes``, or its text could not be parsed (or held a
                NaN, infinite or negative value), or the backend does not (yet) list the
                models it is registered for.

        """
        if not self.models_verified:
            try:
                await self.verify_models(timeout)
            except InvalidRequestError as exc:
                raise BackendError(str(exc), BackendFailure.UNAVAILABLE) from exc
        if self._scraper is None:
            self._scraper = MetricsScraper(
                self.id, self.base_url, self.metrics_filter, self.filtered_metrics_path
            )
        return await self._scraper.sample(
            self._http(), self.parse_metrics, timeout, self.read_limits
        )

    @property
    def metrics_filtered(self) -> bool:
        """Whether scrapes ask for :attr:`metrics_filter` only (False before the first)."""
        return self._scraper is not None and self._scraper.filtered is not None

    async def http_error(self, resp: aiohttp.ClientResponse) -> BackendError:
        """Return the error for a non-200 answer, reading at most a prefix of its body."""
        body, complete = await read_at_most(resp, self.read_limits.error_bytes)
        if not complete:
            resp.close()  # the rest is never read; the connection goes with it
        return http_error(self.id, resp.status, body)

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

    @contextlib.asynccontextmanager
    async def _sse_reads(
        self, path: str, payload: dict[str, Any]
    ) -> AsyncIterator[AsyncGenerator[list[str]]]:
        """POST ``payload``; inside, iterate the event payloads of each network read.

        A context, not a generator over the events: the adapter's own stream reads the
        payloads itself, so a read passes one generator less (docs/design/hot-path.md).
        Connection failures and oversized events inside are translated into
        :class:`BackendError`; leaving the context closes the stream (the backend aborts).
        """
        headers = STREAM_HEADERS
        url = self.url(path)
        with stream_failures(self.id, url):
            async with posted(
                self._http(), url, self.read_timeout,
                data=json_body(payload), headers=headers,
            ) as resp:  # fmt: skip
                if resp.status != 200:
                    raise await self.http_error(resp)
                reads = sse_reads(resp.content, self.loop_share, self.read_timeout)
                async with contextlib.aclosing(reads):
                    yield reads

    def decode_batch(self, batch: list[str]) -> tuple[list[dict[str, Any]], bool]:
        """Decode a read's payloads (:meth:`decode_event`) up to ``[DONE]``; True if it came."""
        objects: list[dict[str, Any]] = []
        for data in batch:
            if data == "[DONE]":
                return objects, True
            objects.append(self.decode_event(data))
        return objects, False

    async def _sse(
        self, path: str, payload: dict[str, Any]
    ) -> AsyncGenerator[list[dict[str, Any]]]:
        """POST ``payload``; yield the JSON objects of each network read until ``[DONE]``/EOF."""
        async with self._sse_reads(path, payload) as reads:
            async for batch in reads:
                objects, done = self.decode_batch(batch)
                if objects or not done:
                    yield objects
                if done:
                    return

    def shape_error(self, obj: object) -> BackendError:
        """Return the error for a stream event that is JSON but not shaped as the API says.

        The message quotes the event (escaped, shortened), never the Python exception its
        reading raised: that is fairq's business, not the caller's.
        """
        return BackendError(
            f"backend {self.id}: unexpected stream event {escape(repr(obj), 200)}",
            BackendFailure.FAILED,
        )

    def stream_end(
        self, request: BackendRequest, finish: str, prompt: int, completion: int
    ) -> StreamEnd:
        """Return the end of ``request``'s stream: its finish reason and the caller's usage.

        Raises:
            BackendError: the stream ended without a finish reason (:meth:`unfinished`).

        """
        if not finish:
            raise self.unfinished()
        prompt, completion = resumed_usage(request.resume, prompt, completion)
        return StreamEnd(finish, prompt, completion)

    def unfinished(self) -> BackendError:
        """Return the error for a stream that ended without saying it was complete."""
        return BackendError(
            f"backend {self.id} ended the stream before the generation finished",
            BackendFailure.UNAVAILABLE,
        )

    def decode_event(self, data: str) -> dict[str, Any]:
        """Parse one SSE payload into a JSON object; an error event raises its error.

        Every event of every stream passes here: orjson parses one in a fraction of the
        standard library's time (docs/design/hot-path.md), and refuses what JSON does not
        allow (NaN, Infinity) as malformed.
        """
        try:
            obj = orjson.loads(data)
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
            kind = FAILURE_BY_HTTP.get(status, BackendFailure.FAILED)
            retryable = status == 429 or status >= 500
        return BackendError(
            f"backend {self.id} failed: {escape(message, 1000)}", kind, retryable=retryable
        )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every backend: building one loads the CA store (~25 ms)."""
    return ssl.create_default_context()
