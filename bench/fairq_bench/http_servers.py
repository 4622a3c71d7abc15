"""``python -m fairq_bench.http_servers``: the HTTP door's framework candidates.

The door's own work (parse a JSON body, stream SSE events one write each) served by each
candidate in a child process, driven by the same aiohttp client:

- ``aiohttp``: ``aiohttp.web`` (C HTTP parser; already fairq's HTTP client towards backends);
- ``starlette``: Starlette's ``StreamingResponse`` on uvicorn, with the HTTP stack the lockfile
  installs (h11; uvicorn's optional httptools/uvloop are not among fairq's dependencies).

Measured: time to the first event of one request at a time (p50/p99), and events per second
plus server CPU per 1,000 events with ``--streams`` concurrent streams of ``--events`` events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import aiohttp

from fairq_bench.processes import child_process, cpu_seconds
from fairq_sim.server import bind_socket

__all__ = ["main"]

_EVENT = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":0,"model":"m",'
    b'"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]}\n\n'
)


def _serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(int(body["events"])):
            await resp.write(_EVENT)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def _serve_starlette(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def handler(request: Request) -> StreamingResponse:
        body = json.loads(await request.body())

        async def events() -> object:
            for _ in range(int(body["events"])):
                yield _EVENT
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")  # type: ignore[arg-type]

    app = Starlette(routes=[Route("/v1/completions", handler, methods=["POST"])])
    sock = bind_socket("127.0.0.1", port)  # listening before uvicorn starts
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


async def _request(session: aiohttp.ClientSession, url: str, events: int) -> tuple[float, int]:
    start = time.monotonic()
    first = 0.0
    seen = 0
    async with session.post(f"{url}/v1/completions", json={"events": events}) as resp:
        async for chunk in resp.content.iter_any():
            if not first:
                first = time.monotonic() - start
            seen += chunk.count(b"\n\n")
    return first, seen - 1


async def _measure(name: str, n: int, streams: int, events: int) -> dict[str, float]:
    argv = ["-m", "fairq_bench.http_servers", "--serve", name]
    async with (
        child_process(argv, r"^(http://\S+)") as (proc, url),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        for _ in range(5):
            await _request(session, url, 4)
        ttfb = []
        for _ in range(n):
            ttfb.append((await _request(session, url, 4))[0])
            await asyncio.sleep(0.005)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        done = await asyncio.gather(*(_request(session, url, events) for _ in range(streams)))
        elapsed, cpu = time.monotonic() - t0, cpu_seconds(proc.pid) - cpu0
    total = sum(seen for _, seen in done)
    ttfb.sort()
    return {
        "ttfb_p50_ms": statistics.median(ttfb) * 1000,
        "ttfb_p99_ms": ttfb[min(len(ttfb) - 1, int(len(ttfb) * 0.99))] * 1000,
        "events_per_s": total / elapsed,
        "cpu_ms_per_1000_events": cpu / total * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    """Serve one candidate (``--serve``) or compare them all."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", choices=("aiohttp", "starlette"))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--events", type=int, default=500)
    args = parser.parse_args(argv)
    if args.serve == "aiohttp":
        _serve_aiohttp(0)
        return 0
    if args.serve == "starlette":
        _serve_starlette(0)
        return 0

    async def run() -> None:
        rows = []
        # Twice each, interleaved, so drift of the shared machine hits both.
        for name in ("aiohttp", "starlette", "starlette", "aiohttp"):
            r = await _measure(name, args.requests, args.streams, args.events)
            rows.append((name, r))
            print(name, {k: round(v, 3) for k, v in r.items()}, flush=True)
        print(
            "\n| server | TTFB p50 (ms) | TTFB p99 (ms) | events/s | server CPU ms / 1000 events |"
        )
        print("|---|---|---|---|---|")
        for name, r in rows:
            print(
                f"| {name} | {r['ttfb_p50_ms']:.2f} | {r['ttfb_p99_ms']:.2f} | "
                f"{r['events_per_s']:.0f} | {r['cpu_ms_per_1000_events']:.1f} |"
            )

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
