"""One line for a failed exchange with a backend, not aiohttp's nested repr."""

from __future__ import annotations

import errno
import socket

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from fairq_server.backends.http_reading import describe_failure


def _key(host: str, port: int) -> ConnectionKey:
    return ConnectionKey(host, port, False, True, None, None, None, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (
            aiohttp.ClientConnectorError(
                _key("10.0.0.7", 8000),
                ConnectionRefusedError(
                    errno.ECONNREFUSED, "Connect call failed ('10.0.0.7', 8000)"
                ),
            ),
            "cannot connect to 10.0.0.7:8000: Connection refused",
        ),
        (
            aiohttp.ClientConnectorError(
                _key("vllm.internal", 8000),
                socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            ),
            "cannot connect to vllm.internal:8000: Name or service not known",
        ),
        (TimeoutError(), "no answer in time"),
        (aiohttp.ServerDisconnectedError(), "the backend closed the connection"),
        (
            aiohttp.ClientPayloadError("Response payload is not completed\n<x>"),
            "ClientPayloadError: Response payload is not completed <x>",
        ),
    ],
)
def test_a_failure_is_one_line_naming_where_and_why(exc: BaseException, text: str) -> None:
    assert describe_failure(exc) == text
