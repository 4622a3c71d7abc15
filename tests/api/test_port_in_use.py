"""``fairq serve`` (a real process) when a port it must listen on is taken: one line naming the
address and the key that set it, exit status 2, no traceback."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fairq_server.app import FairqServer
from fairq_server.config.schema import Config, HttpConfig
from fairq_server.doors.listening import ListenError


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another socket listens on for the length of the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("key", "config"),
    [
        ("listen", 'listen = "127.0.0.1:{port}"\n'),
        ("metrics_listen", 'listen = "127.0.0.1:0"\nmetrics_listen = "127.0.0.1:{port}"\n'),
        ("http.listen", 'listen = "127.0.0.1:0"\n[http]\nlisten = "127.0.0.1:{port}"\n'),
    ],
)
def test_a_port_in_use_is_one_line_naming_address_and_key(
    tmp_path: Path, taken_port: int, key: str, config: str
) -> None:
    path = tmp_path / "fairq.toml"
    path.write_text(config.format(port=taken_port))
    done = subprocess.run(
        [sys.executable, "-m", "fairq_server", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    # Start-up lines at INFO (the store opened) may come first; the failure is one line.
    problems = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert problems == [
        f"fairq: cannot listen on 127.0.0.1:{taken_port} (set by {key}): address already in use "
        "(another process listens there)"
    ], done.stderr


@pytest.mark.parametrize("key", ["listen", "http.listen", "metrics_listen"])
async def test_the_server_raises_a_listen_error_naming_the_key(taken_port: int, key: str) -> None:
    """In process too (whoever assembles the server): a ListenError, and the server stops."""
    address = f"127.0.0.1:{taken_port}"
    config = Config(listen=address if key == "listen" else "127.0.0.1:0")
    if key == "http.listen":
        config = replace(config, http=HttpConfig(listen=address))
    elif key == "metrics_listen":
        config = replace(config, metrics_listen=address)
    server = FairqServer(config)
    with pytest.raises(ListenError) as info:
        await server.start()
    await server.stop(grace=0)
    assert (info.value.key, info.value.address) == (key, address)
    assert info.value.errno == errno.EADDRINUSE
    assert str(info.value) == (
        f"cannot listen on {address} (set by {key}): address already in use "
        "(another process listens there)"
    )
