"""The cheapest HTTP hop: a relay that forwards each POST to a backend and streams it back.

It schedules nothing, parses nothing and holds no state; it is the reference for what any
extra process between a client and a backend costs on the machine at hand (the socket hops
and the wake-ups of one more process), so that the HTTP door's overhead benchmark can show
fairq's own cost beside it. Run as ``python -m fairq_bench.scenarios.bare_relay
--backend URL``; it prints its URL on the first line of stdout.

``--uvloop`` runs it on the event loop ``fairq serve`` uses; ``--parse`` also splits each read
into its SSE events and decodes each event's JSON (orjson), the least a relay that reads
what it forwards does: the hot path's floors (``fairq_bench.hot_path.floor``).
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import orjson
from aiohttp import web

__all__ = ["relay_app", "sse_data"]


def sse_data(chunk: bytes, rest: bytes) -> tuple[list[bytes], bytes]:
    """Split ``rest + chunk`` into its complete SSE events' data and the incomplete tail.

    The stream's closing ``[DONE]`` is left out.
    """
    *events, tail = (rest + chunk).split(b"\n\n")
    datas = [event.removeprefix(b"data: ") for event in events]
    return [data for data in datas if data != b"[DONE]"], tail


def _parse(chunk: bytes, rest: bytes) -> bytes:
    """Decode every complete SSE event of ``rest + chunk``; return the incomplete tail."""
    datas, tail = sse_data(chunk, rest)
    for data in datas:
        orjson.loads(data)
    return tail


def relay_app(backend: str, parse: bool = False) -> web.Application:
    """An application that relays every ``POST /{path}`` to ``backend`` as it comes.

    ``parse``: also decode every event relayed (and drop nothing).
    """

    async def startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )

    async def cleanup(app: web.Application) -> None:
        await app["session"].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["session"]
        async with session.post(
            f"{backend}/{request.match_info['path']}",
            data=body,
            headers={"content-type": request.content_type},
        ) as upstream:
            resp = web.StreamResponse(
                status=upstream.status,
                headers={"content-type": upstream.headers.get("content-type", "text/plain")},
            )
            await resp.prepare(request)
            rest = b""
            async for chunk in upstream.content.iter_any():
                if parse:
                    rest = _parse(chunk, rest)
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_post("/{path:.*}", relay)
    return app


async def _serve(backend: str, parse: bool) -> None:
    runner = web.AppRunner(relay_app(backend.rstrip("/"), parse), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    """Serve the relay until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="the backend's base URL")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop, as fairq does")
    parser.add_argument("--parse", action="store_true", help="decode every event relayed")
    args = parser.parse_args()
    factory = None
    if args.uvloop:
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(args.backend, args.parse))


if __name__ == "__main__":
    main()
