"""The cheapest gRPC door: ``Scheduler/Generate`` relayed to a backend, nothing else.

Each call is posted to the backend's streaming ``/v1/completions`` (aiohttp, uvloop); each
read of the backend is split into its SSE events, each event's JSON decoded (orjson), and
the read's text sent on as one ``chunk`` message, then one ``finished``. No queue, no
accounting, no coalescing beyond what one network read holds: the floor of grpc.aio's
per-message cost under fairq's gRPC door (``fairq_bench.hot_path.floor``). Run as ``python
-m fairq_bench.scenarios.bare_grpc_relay --backend URL``; it prints its target on the first
line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import orjson

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.scenarios.bare_relay import sse_data

__all__ = ["BareScheduler"]


class BareScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Relays ``Generate`` to one backend's completions API."""

    def __init__(self, backend: str) -> None:
        self.url = f"{backend}/v1/completions"
        self.session: aiohttp.ClientSession | None = None

    async def Generate(
        self, request: scheduler_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[scheduler_pb2.GenerateResponse]:
        """Post the prompt; send each read's text as one chunk, then the finish reason."""
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = {"model": request.model, "prompt": request.prompt, "stream": True,
                "max_tokens": request.sampling.max_tokens}  # fmt: skip
        finish, rest = "", b""
        async with self.session.post(self.url, json=body) as resp:
            async for read in resp.content.iter_any():
                datas, rest = sse_data(read, rest)
                texts = []
                for data in datas:
                    for choice in orjson.loads(data).get("choices", ()):
                        texts.append(choice.get("text", ""))
                        finish = choice.get("finish_reason") or finish
                if texts:
                    chunk = scheduler_pb2.Chunk(text="".join(texts))
                    yield scheduler_pb2.GenerateResponse(chunk=chunk)
        done = scheduler_pb2.Finished(finish_reason=finish)
        yield scheduler_pb2.GenerateResponse(finished=done)


async def _serve(backend: str) -> None:
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(BareScheduler(backend), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    """Serve the relay on uvloop until killed."""
    import uvloop

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="the backend's base URL")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(parser.parse_args().backend.rstrip("/")))


if __name__ == "__main__":
    main()
