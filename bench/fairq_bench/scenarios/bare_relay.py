"""The cheapest HTTP hop: a relay that forwards each POST to a backend and streams it back.

It schedules nothing, parses nothing and holds no state; it is the reference for what any
extra process between a client and a backend costs on the machine at hand (the socket hops
and the wake-ups of one more process), so that the HTTP door's overhead benchmark can show
fairq's own cost beside it. Run as ``python -m fairq_bench.scenarios.bare_relay
--backend URL``; it prints its URL on the first line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

__all__ = ["relay_app"]


def relay_app(backend: str) -> web.Application:
    """An application that relays every ``POST /{path}`` to ``backend`` as it comes."""

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
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_post("/{path:.*}", relay)
    return app


async def _serve(backend: str) -> None:
    runner = web.AppRunner(relay_app(backend.rstrip("/")), access_log=None)
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
    asyncio.run(_serve(parser.parse_args().backend))


if __name__ == "__main__":
    main()
