"""The HTTP door's connection bounds, over real sockets: silent and slow-header connections
are closed, the per-door and per-peer caps refuse the connection beyond them and count it, and
a process out of descriptors logs its accept failures once per interval, not per attempt."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from fairq_server.app import FairqServer
from fairq_sim import SimServer

from ..conftest import FairqFactory
from .conftest import Door, start_door
from .test_door import until

REFUSED = "fairq_http_connections_refused_total"


def refused(server: FairqServer, reason: str) -> float:
    value = server.core.telemetry.registry.get_sample_value(REFUSED, {"reason": reason})
    return value or 0.0


def open_connections(server: FairqServer) -> float:
    return server.core.telemetry.registry.get_sample_value("fairq_http_connections") or 0.0


async def connect(door: Door) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", door.server.http_port)


async def closed_after(reader: asyncio.StreamReader, limit: float) -> tuple[bytes, float]:
    """Read until the server closes the connection; return what it sent and when."""
    start = time.monotonic()
    async with asyncio.timeout(limit):
        data = await reader.read()
    return data, time.monotonic() - start


GET_MODELS = b"GET /v1/models HTTP/1.1\r\nhost: fairq\r\n\r\n"


async def test_a_silent_connection_is_closed_after_the_idle_bound(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim, idle_timeout_seconds=0.5)
    reader, writer = await connect(door)
    data, elapsed = await closed_after(reader, 5.0)
    assert data == b"" and elapsed >= 0.4
    assert refused(door.server, "idle_timeout") == 1
    writer.close()
    # A kept-alive connection is closed the same way after its last answer.
    reader, writer = await connect(door)
    writer.write(GET_MODELS)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    data, elapsed = await closed_after(reader, 5.0)
    assert data == b"" and elapsed >= 0.4
    assert refused(door.server, "idle_timeout") == 2
    writer.close()


async def test_a_slow_header_sender_is_closed_after_the_head_bound(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim, head_timeout_seconds=1.0, idle_timeout_seconds=0.5)
    reader, writer = await connect(door)
    start = time.monotonic()

    async def trickle() -> None:
        # One byte every 0.2 s, each well within the idle bound: only the head bound stops it.
        for byte in b"GET /v1/models HTTP/1.1\r\nhost: fairq\r\nx-padding: " + b"a" * 100:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)

    sender = asyncio.create_task(trickle())
    try:
        data, _ = await closed_after(reader, 5.0)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    elapsed = time.monotonic() - start
    assert data.startswith(b"HTTP/1.1 408"), data
    assert b'"head_timeout"' in data
    assert 0.9 <= elapsed < 3.0
    assert refused(door.server, "head_timeout") == 1
    writer.close()


async def test_the_peer_and_door_caps_refuse_the_next_connection_and_count_it(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    door = await start_door(fairq_factory, sim, max_connections_per_peer=3, max_connections=5)
    held = [await connect(door) for _ in range(3)]
    await until(lambda: open_connections(door.server) == 3)
    reader, writer = await connect(door)
    data, _ = await closed_after(reader, 5.0)
    assert data.startswith(b"HTTP/1.1 503"), data
    assert b"too many open connections from your address" in data
    assert refused(door.server, "peer_full") == 1
    writer.close()
    # The connections held still work.
    reader, writer = held[0]
    writer.write(GET_MODELS)
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    # The door's own cap counts every peer: 127.0.0.2 is another address on loopback.
    for _ in range(2):
        held.append(await asyncio.open_connection("127.0.0.1", door.server.http_port))
    await until(lambda: open_connections(door.server) == 3)  # two of them were peer_full
    assert refused(door.server, "peer_full") == 3
    other = [
        await asyncio.open_connection(
            "127.0.0.1", door.server.http_port, local_addr=("127.0.0.2", 0)
        )
        for _ in range(2)
    ]
    await until(lambda: open_connections(door.server) == 5)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", door.server.http_port, local_addr=("127.0.0.2", 0)
    )
    data, _ = await closed_after(reader, 5.0)
    assert b"the server has too many open connections" in data
    assert refused(door.server, "door_full") == 1
    for _, w in [*held, *other, (reader, writer)]:
        w.close()
    await until(lambda: open_connections(door.server) == 0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _serve_out_of_descriptors(
    sim: SimServer, tmp_path: Path, loop: str, watch: Callable[[Path], Awaitable[None]]
) -> bytes:
    """Run ``fairq serve --loop LOOP``, leave it four descriptors, connect 40 clients.

    ``watch`` runs while the clients hold their connections; once they are closed the
    process must answer a new request (it recovered) and stop on SIGTERM. Returns its log.
    """
    http_port = _free_port()
    config = tmp_path / "fairq.toml"
    config.write_text(
        f'listen = "127.0.0.1:0"\nmetrics_listen = ""\n[http]\nlisten = "127.0.0.1:{http_port}"\n'
        f'[[backends]]\nid = "a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
    )
    log = tmp_path / "fairq.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fairq_server", "serve", "--config", str(config),
            "--grace", "1", "--loop", loop, stdout=out, stderr=out, process_group=0,
        )  # fmt: skip
    clients: list[socket.socket] = []
    try:
        async with asyncio.timeout(30):
            # Waiting for another process to listen: there is no event to await.
            while True:
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", http_port)
                except OSError:
                    await asyncio.sleep(0.05)
                    continue
                w.close()
                break
        # Leave the server four descriptors: the connections below exhaust them.
        used = len(os.listdir(f"/proc/{proc.pid}/fd"))
        hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (used + 4, hard))
        for _ in range(40):
            clients.append(socket.create_connection(("127.0.0.1", http_port)))
        await watch(log)
        for client in clients:
            client.close()
        clients.clear()
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (hard, hard))
        async with asyncio.timeout(20):
            # The process recovered: a new connection gets an answer (the door's own 404).
            while True:
                reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
                writer.write(b"GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                answer = await reader.read()
                writer.close()
                if answer.startswith(b"HTTP/1.1 404"):
                    break
                await asyncio.sleep(0.1)  # a connection accepted before the limit was lifted
    finally:
        for client in clients:
            client.close()
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await proc.wait()
    return log.read_bytes()


async def test_an_accept_storm_is_logged_once_per_interval(sim: SimServer, tmp_path: Path) -> None:
    """asyncio's own loop reports every failed accept: fairq logs one line per interval."""

    async def two_rounds_logged_once(log: Path) -> None:
        async with asyncio.timeout(10):
            # Polling another process's log with a deadline: there is no event to await.
            while b"accept" not in log.read_bytes():  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(0.05)
        # An observation window, not a synchronisation: asyncio retries accepting every
        # second, so 2.5 s hold at least two more rounds of failures.
        await asyncio.sleep(2.5)

    text = await _serve_out_of_descriptors(sim, tmp_path, "asyncio", two_rounds_logged_once)
    assert len(text) < 20_000, f"{len(text)} bytes of log"
    assert b"Traceback" not in text, text[-2000:]
    lines = [line for line in text.splitlines() if b"accept" in line]
    assert len(lines) == 1 and b"the HTTP door cannot accept connections" in lines[0], lines


async def test_out_of_descriptors_on_uvloop_sheds_quietly_and_recovers(
    sim: SimServer, tmp_path: Path
) -> None:
    """uvloop (libuv) accepts and closes what it cannot hold, reporting nothing per attempt."""

    async def hold(log: Path) -> None:
        # An observation window: two of asyncio's retry rounds, had there been any.
        await asyncio.sleep(2.5)

    text = await _serve_out_of_descriptors(sim, tmp_path, "uvloop", hold)
    assert len(text) < 20_000, f"{len(text)} bytes of log"
    assert b"Traceback" not in text, text[-2000:]
