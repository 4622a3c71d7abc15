"""A pooled connection the backend closed while idle is not the backend's failure.

Engines close keep-alive connections on their own schedule (vLLM's server and llama.cpp's
after 5 s idle, llama.cpp's also under load). A request sent on such a connection fails
before the backend sees it; fairq sends it once more on another connection instead of
failing it over (which would also pause the backend until its next scrape).

The server below answers the first request on each connection and drops the connection at
the second one without answering: what a client sees when it reuses a connection the
server has just closed. A real engine does this only at its idle timeout, a race a test
cannot time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fairq_server.backends.request import BackendRequest, Sampling, StreamEnd, TextDelta
from fairq_server.backends.vllm import VllmBackend

_EVENT = (
    b'data: {"id":"c","object":"text_completion","model":"m","choices":[{"index":0,'
    b'"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":1,'
    b'"completion_tokens":1,"total_tokens":2}}\n\ndata: [DONE]\n\n'
)


class DroppingServer:
    """Answers once per connection, then closes it at the next request unanswered."""

    def __init__(self) -> None:
        self.connections = 0
        self.answered = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                if served:
                    return  # the connection closes with the request unanswered
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(_EVENT), _EVENT)
                )
                await writer.drain()
                served = True
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest.fixture
async def dropping() -> AsyncIterator[tuple[str, DroppingServer]]:
    state = DroppingServer()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", state


@pytest.mark.parametrize("relay", [False, True], ids=["grpc", "http"])
async def test_a_request_on_a_dropped_pooled_connection_is_sent_again(
    dropping: tuple[str, DroppingServer], relay: bool
) -> None:
    url, server = dropping
    backend = VllmBackend("v", url, ["m"])
    request = BackendRequest("m", prompt="x", sampling=Sampling(max_tokens=1), relay_chunks=relay)
    try:
        for _ in range(3):  # the second and third each reuse the connection of the one before
            events = [e async for e in backend.stream(request, 0)]
            assert any(isinstance(e, TextDelta) and e.tokens for e in events)
            assert isinstance(events[-1], StreamEnd) and events[-1].finish_reason == "length"
    finally:
        await backend.aclose()
    assert server.answered == 3
    assert server.connections >= 3  # each later request went again on a fresh connection
