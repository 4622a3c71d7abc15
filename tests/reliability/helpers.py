"""Helpers for the reliability tests: polling, metric reads, outcomes, a scripted HTTP backend."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.app import FairqServer
from fairq_sim import SimServer

__all__ = [
    "VLLM_IDLE_METRICS",
    "Outcome",
    "ScriptedBackend",
    "fairq_metric",
    "gen_request",
    "run_call",
    "sim_requests_seen",
    "until",
]


async def until(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Wait, with a deadline, for a condition in state that offers no event to await.

    Raises:
        AssertionError: the condition did not hold within ``timeout`` seconds.

    """
    try:
        async with asyncio.timeout(timeout):
            # Polling another component's state (or another process's): nothing to await.
            while not predicate():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


async def until_async(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """:func:`until` for a predicate that must itself do I/O (another process's metrics)."""
    try:
        async with asyncio.timeout(timeout):
            while not await predicate():  # noqa: ASYNC110 - another process's state
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def fairq_metric(server: FairqServer, name: str, **labels: str) -> float:
    """A sample of an in-process fairq's own metrics (0 when the series does not exist yet)."""
    value = server.core.telemetry.registry.get_sample_value(name, labels)
    return value if value is not None else 0.0


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus exposition text as ``{(sample name, sorted labels): value}``."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric_sum(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
               **labels: str) -> float:  # fmt: skip
    """Sum of every sample called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


async def sim_requests_seen(sim: str | SimServer) -> int:
    """Generation requests a (vLLM-mode) simulator has accepted: finished + running + waiting.

    ``sim`` is a simulator in this process (read directly, so a ``metrics_fail`` fault does
    not hide it) or the base URL of one in another process. Aborted requests count among the
    finished ones (``finished_reason="abort"``).
    """
    if isinstance(sim, SimServer):
        text = sim.state.metrics.render().decode()
    else:
        async with httpx.AsyncClient() as client:
            text = (await client.get(sim + "/metrics")).text
    samples = parse_metrics(text)
    return int(
        metric_sum(samples, "vllm:request_success_total")
        + metric_sum(samples, "vllm:num_requests_running")
        + metric_sum(samples, "vllm:num_requests_waiting")
    )


def gen_request(
    prompt: str = "Hello there", max_tokens: int = 8, model: str = "sim", **kw: object
) -> scheduler_pb2.GenerateRequest:
    """A GenerateRequest with an exact output length (``ignore_eos``)."""
    sampling = scheduler_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return scheduler_pb2.GenerateRequest(
        model=model,
        prompt=prompt,
        sampling=sampling,
        **kw,  # type: ignore[arg-type]
    )


class Outcome:
    """Everything one Generate call produced: events in order, then its final status."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.backends: list[str] = []
        self.text = ""
        self.finished: scheduler_pb2.Finished | None = None
        self.code = grpc.StatusCode.OK
        self.details = ""

    @property
    def chunks(self) -> int:
        """Number of chunk events received."""
        return self.kinds.count("chunk")

    def __repr__(self) -> str:
        events = [k for k in self.kinds if k != "chunk"]
        return f"Outcome({events}, chunks={self.chunks}, {self.code.name}: {self.details!r})"


async def run_call(call: GenerateCall,
                   outcome: Outcome | None = None) -> Outcome:  # fmt: skip
    """Read ``call`` to its end, recording events and the final status (never raises)."""
    out = outcome if outcome is not None else Outcome()
    try:
        while (response := await call.read()) is not grpc.aio.EOF:
            assert isinstance(response, scheduler_pb2.GenerateResponse)
            kind = response.WhichOneof("event")
            assert kind is not None
            out.kinds.append(kind)
            if kind == "started":
                out.backends.append(response.started.backend_id)
            elif kind == "chunk":
                out.text += response.chunk.text
            elif kind == "finished":
                out.finished = response.finished
    except grpc.aio.AioRpcError as exc:
        out.code, out.details = exc.code(), exc.details() or ""
    return out


GenerateCall = grpc.aio.UnaryStreamCall[
    scheduler_pb2.GenerateRequest, scheduler_pb2.GenerateResponse
]


def generate(
    channel: grpc.aio.Channel,
    request: scheduler_pb2.GenerateRequest,
    *,
    metadata: Sequence[tuple[str, str]] = (),
    timeout: float | None = None,
) -> GenerateCall:
    """Start ``Scheduler/Generate`` on ``channel`` (typed as the aio call it is)."""
    return scheduler_pb2_grpc.SchedulerStub(channel).Generate(
        request, metadata=tuple(metadata), timeout=timeout
    )


async def send_raw(port: int, data: bytes, window: float = 1.0) -> bytes:
    """Send ``data`` on a fresh TCP connection; return what the server answered until it
    closed the connection (or ``window`` seconds passed: then we close it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    try:
        writer.write(data)
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(window):
                while chunk := await reader.read(65536):
                    received += chunk
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return received


# -- a raw, scripted HTTP backend ---------------------------------------------------------

VLLM_IDLE_METRICS = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="x"} 0.0\n'
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="x"} 0.0\n'
)

Reply = Callable[[dict[str, object], asyncio.StreamWriter], Awaitable[None]]
"""Writes the whole HTTP answer to one generation request (the connection closes after)."""


def sse_reply(*events: bytes, status: int = 200, headers: str = "") -> Reply:
    """A reply that sends ``events`` verbatim as the body of a chunked SSE response."""

    async def reply(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        head = (
            f"HTTP/1.1 {status} X\r\ncontent-type: text/event-stream\r\n"
            f"transfer-encoding: chunked\r\nconnection: close\r\n{headers}\r\n"
        )
        writer.write(head.encode())
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return reply


def raw_reply(data: bytes) -> Reply:
    """A reply that writes ``data`` as-is (need not be HTTP at all)."""

    async def reply(body: dict[str, object], writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()

    return reply


class ScriptedBackend:
    """A minimal HTTP/1.1 server posing as a vLLM backend, answering what the test scripts.

    ``GET /metrics`` (and ``/metrics/``, where fairq asks vLLM by name) answers
    :attr:`metrics` (by default an idle vLLM, so fairq's gate admits); every ``POST`` is
    recorded in :attr:`requests` (its JSON body) and answered by :attr:`reply`, which may
    write anything at all, including bytes that are not HTTP.
    """

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.metrics = VLLM_IDLE_METRICS  # what /metrics answers; a test may change it
        self.requests: list[dict[str, object]] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ScriptedBackend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
                }
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET" and path == "/v1/models":
                    # No model listing (as older servers): fairq trusts the registration.
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if method == "GET" and path.partition("?")[0] in ("/metrics", "/metrics/"):
                    # fairq asks vLLM's /metrics/ by name; the whole exposition reads the same.
                    body = self.metrics.encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    await writer.drain()
                    continue
                self.requests.append(json.loads(raw) if raw else {})
                await self.reply(self.requests[-1], writer)
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def completion_events(texts: Sequence[str], finish: str = "length") -> list[bytes]:
    """A well-formed vLLM completions SSE body carrying ``texts``, ending with ``[DONE]``."""
    events = [
        b"data: " + json.dumps({"choices": [{"index": 0, "text": t}]}).encode() + b"\n\n"
        for t in texts
    ]
    last = {"choices": [{"index": 0, "text": "", "finish_reason": finish}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(texts)}}
    events.append(b"data: " + json.dumps(last).encode() + b"\n\n")
    events.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events
