"""``python -m fairq_bench.scenarios.firehose``: a token source faster than the sim.

Measuring how many tokens per second one fairq process can relay needs a backend that is
not itself the bottleneck. The simulator is Python and spends most of its CPU on HTTP and
JSON per token; this server speaks just enough of vLLM's OpenAI API for fairq (streaming
``/v1/completions``, ``/metrics``) and writes pre-encoded events: one SSE event per token,
as vLLM sends, every stream advanced once per "engine step" of ``--step-ms`` (0: as fast as
the loop turns). Every token's text is one character, so characters count tokens. With
``--first-now`` a stream's first token is written as soon as its request is read (a prefill
that costs nothing), so time to first token measures the path to the backend and back, not
where the request fell in the engine's step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

__all__ = ["main"]

_EVENT = (
    b'data: {"id":"cmpl-fh","object":"text_completion","created":0,"model":"sim",'
    b'"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]}\n\n'
)
_CHUNK = b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT)


def _final(tokens: int) -> bytes:
    last = (
        b'data: {"id":"cmpl-fh","object":"text_completion","created":0,"model":"sim",'
        b'"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":"length"}]}\n\n'
    )
    usage = json.dumps(
        {
            "id": "cmpl-fh",
            "object": "text_completion",
            "created": 0,
            "model": "sim",
            "choices": [],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8},
        }
    ).encode()
    body = last + b"data: " + usage + b"\n\ndata: [DONE]\n\n"
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


class Firehose:
    """Streams advanced in lock-step, like a continuous-batching engine's output."""

    def __init__(self, step: float, first_now: bool = False) -> None:
        self.step = step
        self.first_now = first_now
        self.streams: dict[asyncio.StreamWriter, list[int]] = {}
        self.done: dict[asyncio.StreamWriter, asyncio.Future[None]] = {}
        self.tokens = 0

    async def run(self) -> None:
        """Write one token to every open stream per step."""
        while True:
            for writer, left in list(self.streams.items()):
                if writer.is_closing():  # the client went away: abort, as vLLM does
                    del self.streams[writer]
                    self.done.pop(writer).set_result(None)
                    continue
                if left[0] > 1:
                    writer.write(_CHUNK)
                    left[0] -= 1
                else:
                    writer.write(_final(left[1]))
                    del self.streams[writer]
                    self.done.pop(writer).set_result(None)
                self.tokens += 1
            await asyncio.sleep(self.step)

    def metrics(self) -> bytes:
        """vLLM-named gauges and a constant TPOT histogram (no TPOT change: never gated)."""
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="sim"}} {len(self.streams)}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="sim"} 0\n'
            "# TYPE vllm:request_time_per_output_token_seconds histogram\n"
            'vllm:request_time_per_output_token_seconds_sum{model_name="sim"} 0.0\n'
            'vllm:request_time_per_output_token_seconds_count{model_name="sim"} 0\n'
            "# TYPE firehose_tokens counter\n"
            f"firehose_tokens_total {self.tokens}\n"
        ).encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one keep-alive connection."""
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *headers = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                length = 0
                for h in headers:
                    if h.lower().startswith("content-length:"):
                        length = int(h.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if method == "POST" and path.startswith("/v1/completions"):
                    tokens = max(int(json.loads(body).get("max_tokens") or 16), 1)
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n"
                    )
                    left = tokens
                    if self.first_now:
                        writer.write(_CHUNK if tokens > 1 else _final(tokens))
                        self.tokens += 1
                        left -= 1
                    if left:
                        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                        self.done[writer] = done
                        self.streams[writer] = [left, tokens]
                        await done
                    await writer.drain()
                    continue
                if path.startswith("/metrics"):
                    payload = self.metrics()
                elif path.startswith("/v1/models"):
                    payload = b'{"object":"list","data":[{"id":"sim","object":"model"}]}'
                else:
                    payload = b"{}"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(payload), payload)
                )
                await writer.drain()
        self.streams.pop(writer, None)
        self.done.pop(writer, None)
        writer.close()


async def _serve(port: int, step: float, first_now: bool) -> None:
    hose = Firehose(step, first_now)
    server = await asyncio.start_server(hose.handle, "127.0.0.1", port)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    runner = asyncio.create_task(hose.run())
    try:
        await server.serve_forever()
    finally:
        runner.cancel()


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM."""
    parser = argparse.ArgumentParser(prog="firehose", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--step-ms", type=float, default=10.0, help="one token per stream per step")
    parser.add_argument(
        "--first-now", action="store_true", help="write each stream's first token at once"
    )
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.step_ms / 1000, args.first_now))
    return 0


if __name__ == "__main__":
    sys.exit(main())
