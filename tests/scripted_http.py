"""Real HTTP servers on loopback that answer as a test scripts them.

Adapters, the poller and the dispatcher are tested against these instead of a mocked client:
the bytes travel through a socket and the real HTTP client, so framing, chunking, hang-ups and
closing behave as they do in production.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import RawTestServer

__all__ = [
    "Handler",
    "RecordingProxy",
    "hang_up",
    "reply",
    "serve",
    "sse",
    "unused_url",
]

#: Answers one request; may be a plain function or a coroutine function.
Handler = Callable[[web.BaseRequest], "web.StreamResponse | Awaitable[web.StreamResponse]"]


def sse(body: bytes, status: int = 200) -> web.Response:
    """A complete ``text/event-stream`` answer."""
    return web.Response(status=status, body=body, content_type="text/event-stream")


def reply(status: int = 200, text: str = "", json_body: object = None) -> web.Response:
    """A plain answer: ``json_body`` as JSON if given, else ``text``."""
    if json_body is not None:
        return web.json_response(json_body, status=status)
    return web.Response(status=status, text=text)


async def hang_up(request: web.BaseRequest) -> web.StreamResponse:
    """Close the connection without answering (the client sees a server disconnect)."""
    assert request.transport is not None
    request.transport.close()
    raise ConnectionResetError("hung up on purpose")


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """Serve every request with ``handler`` on ``127.0.0.1``; yield the base URL."""

    async def respond(request: web.BaseRequest) -> web.StreamResponse:
        answer = handler(request)
        return answer if isinstance(answer, web.StreamResponse) else await answer

    server = RawTestServer(respond, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def unused_url() -> str:
    """The URL of a loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class RecordingProxy:
    """Forwards every request to ``upstream`` unchanged, recording the JSON body of each POST.

    Use as an async context manager; point the client at :attr:`url`.

    Attributes:
        posts: ``(path, body)`` of every POST, in order.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.url = ""
        self._stack = contextlib.AsyncExitStack()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of :attr:`posts`."""
        return [body for _, body in self.posts]

    async def __aenter__(self) -> RecordingProxy:
        http = await self._stack.enter_async_context(ClientSession())

        async def forward(request: web.BaseRequest) -> web.StreamResponse:
            body = await request.read()
            if request.method == "POST":
                self.posts.append((request.path, json.loads(body)))
            async with http.request(
                request.method, self.upstream + request.path_qs, data=body,
                headers={"content-type": request.headers.get("content-type", "")},
            ) as upstream:  # fmt: skip
                answer = web.StreamResponse(status=upstream.status)
                answer.content_type = upstream.content_type
                await answer.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer

        self.url = await self._stack.enter_async_context(serve(forward))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
