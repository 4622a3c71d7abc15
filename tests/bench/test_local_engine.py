"""Finding a local server's processes by its port, and reading their CPU."""

from __future__ import annotations

import socket
import subprocess
import sys

from fairq_bench.local_engine import engine_pids, tree_run_seconds

# Listens, starts a child that spins for 0.2 s of CPU, then waits to be killed.
_SERVER = (
    "import socket, subprocess, sys\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "spin = 'import time\\nend = time.process_time() + 0.2\\n"
    "while time.process_time() < end: pass\\nimport sys; sys.stdin.read()'\n"
    "child = subprocess.Popen([sys.executable, '-c', spin], stdin=subprocess.PIPE)\n"
    "print(s.getsockname()[1], child.pid, flush=True)\n"
    "sys.stdin.read()\n"
)


def test_engine_pids_finds_the_listener_and_its_children() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port, child = (int(x) for x in server.stdout.readline().split())
        pids = engine_pids(f"http://127.0.0.1:{port}/")
        assert pids[0] == server.pid and child in pids
        assert tree_run_seconds(pids) > 0.0
    finally:
        server.kill()
        server.wait()


def test_engine_pids_of_a_remote_or_closed_port_is_empty() -> None:
    assert engine_pids("http://10.1.2.3:8000") == []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        assert engine_pids(f"http://127.0.0.1:{port}") == []
