"""A backend that misbehaves on purpose: one scripted HTTP/1.1 server, many bad behaviours.

It poses as vLLM (or TGI: fairq's TGI adapter reads the same idle ``/metrics`` text). What
``GET /metrics`` answers is one of :data:`METRICS_MODES`, what any ``POST`` answers one of
:data:`GENERATE_MODES`; both can change while it runs. The reliability tests drive it in
process; the hostile benchmark (:mod:`fairq_bench.hostile`) runs it as a child::

    python -m fairq_bench.hostile_backend --metrics endless --generate ok

It writes raw bytes on the socket, so it can send what no well-behaved HTTP framework would:
bodies that never end, declared lengths it never sends, values no exporter should export.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

__all__ = ["GENERATE_MODES", "METRICS_MODES", "HostileBackend", "main"]

IDLE_METRICS = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="x"} 0.0\n'
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="x"} 0.0\n'
)
_LINE = b"# HELP vllm:never_ending a series that is not there\n" * 20_000  # ~1 MiB
MiB = 1024 * 1024
_HEAD = "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\n{length}connection: close\r\n\r\n"


def _gauges(waiting: str, running: str) -> bytes:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="x"}} {waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="x"}} {running}\n'
    ).encode()


def _data(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _completion(usage: dict[str, object]) -> list[bytes]:
    """A vLLM completions stream of two tokens whose final usage is ``usage``."""
    return [
        _data({"choices": [{"index": 0, "text": "Hello"}]}),
        _data({"choices": [{"index": 0, "text": " world", "finish_reason": "length"}]}),
        _data({"choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


# -- what GET /metrics answers -----------------------------------------------------------

#: Complete /metrics bodies (answered with a Content-Length).
_METRICS_BODIES: dict[str, bytes] = {
    "idle": IDLE_METRICS.encode(),
    "nan": _gauges("NaN", "0.0"),
    "negative": _gauges("0.0", "-1.0"),
    "infinite": _gauges("+Inf", "0.0"),
}
#: Answers written piece by piece (see HostileBackend._stream_metrics).
_METRICS_STREAMS = {"endless", "dribble", "declared-huge", "silent"}
METRICS_MODES = (*_METRICS_BODIES, *sorted(_METRICS_STREAMS))

# -- what a POST answers ------------------------------------------------------------------

_STREAM_BODIES: dict[str, list[bytes]] = {
    "ok": _completion({"prompt_tokens": 3, "completion_tokens": 2}),
    "usage-negative": _completion({"prompt_tokens": 3, "completion_tokens": -5}),
    "usage-infinity": [
        *_completion({"prompt_tokens": 3, "completion_tokens": 2})[:2],
        b'data: {"choices": [], "usage": {"prompt_tokens": Infinity, "completion_tokens": 2}}\n\n',
        b"data: [DONE]\n\n",
    ],
    "usage-huge": _completion({"prompt_tokens": 1e300, "completion_tokens": 2}),
    "usage-fraction": _completion({"prompt_tokens": 3, "completion_tokens": 2.5}),
    "usage-string": _completion({"prompt_tokens": "three", "completion_tokens": 2}),
    # TGI /generate_stream: a token without its text; a last event without generated_tokens.
    "tgi-no-text": [_data({"token": {"id": 1, "special": False}})],
    "tgi-no-generated-tokens": [
        _data({"token": {"id": 1, "text": "Hi", "special": False}}),
        _data(
            {
                "token": {"id": 2, "text": "!", "special": False},
                "details": {"finish_reason": "length", "input_length": 3},
            }
        ),
    ],
    # A stream error whose message would start a forged log line if logged as is.
    "event-injection": [
        _data({"error": "engine failed\n2026-01-01 00:00:00 ERROR fairq: FORGED event line"})
    ],
}
_ERROR_BODIES: dict[str, bytes] = {
    "error-injection": b"engine failed\r\n2026-01-01 00:00:00 ERROR fairq: FORGED http line",
}
_GENERATE_STREAMS = {"error-endless", "error-declared-huge", "silent"}
GENERATE_MODES = (*_STREAM_BODIES, *_ERROR_BODIES, *sorted(_GENERATE_STREAMS))


class HostileBackend:
    """The server; use as an async context manager, then point fairq at :attr:`url`.

    Attributes:
        metrics: the :data:`METRICS_MODES` entry ``GET /metrics`` answers with.
        generate: the :data:`GENERATE_MODES` entry any ``POST`` answers with (any other
            ``GET`` is answered 404).
        posts: how many POSTs arrived.
        scrapes: how many ``GET /metrics`` arrived.
        sent: body bytes written by the endless modes (what fairq was offered).
        hung_up: set each time fairq closed a connection while an endless body was sent.

    """

    def __init__(self, metrics: str = "idle", generate: str = "ok") -> None:
        if metrics not in METRICS_MODES or generate not in GENERATE_MODES:
            raise ValueError(f"unknown mode {metrics!r} / {generate!r}")
        self.metrics = metrics
        self.generate = generate
        self.posts = 0
        self.scrapes = 0
        self.sent = 0
        self.hung_up = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HostileBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, port: int = 0) -> None:
        """Listen on ``127.0.0.1:port`` (0: any free port)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        """Stop listening and drop every connection."""
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
                length = next(
                    (int(v) for k, _, v in (h.partition(":") for h in lines[1:])
                     if k.strip().lower() == "content-length"),
                    0,
                )  # fmt: skip
                await reader.readexactly(length)
                if method == "GET" and path == "/metrics":
                    self.scrapes += 1
                    if self.metrics in _METRICS_BODIES:
                        await _answer(writer, "200 OK", _METRICS_BODIES[self.metrics])
                        continue
                    await self._stream_metrics(writer)
                elif method == "GET":
                    # Any other GET (fairq's /v1/models check): no such endpoint, which fairq
                    # takes as "not checked". Not a generation request, so not a post.
                    await _answer(writer, "404 Not Found", b"not found")
                    continue
                else:
                    self.posts += 1
                    await self._answer_post(writer)
                break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up.set()
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _stream_metrics(self, writer: asyncio.StreamWriter) -> None:
        mode = self.metrics
        if mode == "silent":
            await asyncio.Event().wait()  # headers never come
        if mode == "dribble":
            writer.write(_head("200 OK", "text/plain", None))
            while True:  # a small valid body, one line every 100 ms, never finished
                await _chunk(writer, b"# HELP x slow\n")
                self.sent += 14
                await asyncio.sleep(0.1)
        declared = 10 * 1024**3 if mode == "declared-huge" else None
        writer.write(_head("200 OK", "text/plain", declared))
        await self._endless(writer, _LINE, chunked=declared is None)

    async def _answer_post(self, writer: asyncio.StreamWriter) -> None:
        mode = self.generate
        if mode in _STREAM_BODIES:
            await _answer(writer, "200 OK", b"".join(_STREAM_BODIES[mode]), "text/event-stream")
        elif mode in _ERROR_BODIES:
            await _answer(writer, "500 Internal Server Error", _ERROR_BODIES[mode])
        elif mode == "silent":
            await asyncio.Event().wait()
        else:
            declared = 10 * 1024**3 if mode == "error-declared-huge" else None
            writer.write(_head("500 Internal Server Error", "text/plain", declared))
            await self._endless(writer, b"e" * MiB, chunked=declared is None)

    async def _endless(self, writer: asyncio.StreamWriter, piece: bytes, *, chunked: bool) -> None:
        """Write ``piece`` for ever, as fast as the reader takes it (until it hangs up)."""
        while True:
            if chunked:
                await _chunk(writer, piece)
            else:
                writer.write(piece)
                await writer.drain()
            self.sent += len(piece)


def _head(status: str, ctype: str, length: int | None) -> bytes:
    framing = (
        "transfer-encoding: chunked\r\n" if length is None else f"content-length: {length}\r\n"
    )
    return _HEAD.format(status=status, ctype=ctype, length=framing).encode()


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


async def _answer(
    writer: asyncio.StreamWriter, status: str, body: bytes, ctype: str = "text/plain"
) -> None:
    writer.write(_head(status, ctype, len(body)) + body)
    await writer.drain()


def main(argv: list[str] | None = None) -> int:
    """Run the server until killed; print its URL on stdout when it listens."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--metrics", default="idle", choices=METRICS_MODES)
    parser.add_argument("--generate", default="ok", choices=GENERATE_MODES)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    async def run() -> None:
        backend = HostileBackend(args.metrics, args.generate)
        await backend.start(args.port)
        print(backend.url, flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
