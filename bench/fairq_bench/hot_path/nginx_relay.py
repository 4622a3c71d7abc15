"""A compiled reference relay for the hot path's floors: nginx as a streaming reverse proxy.

One worker process, no buffering of the answer (each read of the backend written on as it
comes, as an SSE relay must), connections to the backend kept alive, no access log. Only
for the benchmark (Debian's ``nginx-light``); fairq does not use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from fairq_bench.targets import free_port

__all__ = ["nginx_relay"]

_CONFIG = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir};
    proxy_temp_path {dir};
    upstream backend {{ server {backend}; keepalive 512; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def _write_config(folder: str, backend: str, port: int) -> str:
    config = Path(folder) / "nginx.conf"
    config.write_text(_CONFIG.format(dir=folder, backend=backend, port=port))
    return str(config)


def _log_tail(folder: str) -> str:
    log = Path(folder) / "error.log"
    return log.read_text()[-1000:] if log.exists() else ""


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@contextlib.asynccontextmanager
async def nginx_relay(backend: str, cpus: Sequence[int]) -> AsyncIterator[tuple[list[int], str]]:
    """Run nginx relaying to ``backend`` (``http://host:port``) on ``cpus``.

    Yields its processes' pids (master and worker) and its base URL.

    Raises:
        RuntimeError: nginx is not installed or did not start.

    """
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if binary is None:
        raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = _write_config(tmp, backend.removeprefix("http://"), port)
        proc = await asyncio.create_subprocess_exec(
            "taskset", "-c", ",".join(map(str, cpus)),
            binary, "-c", config, "-p", tmp, "-g", "daemon off;",
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start: {_log_tail(tmp)}")
                await asyncio.sleep(0.05)
            yield [proc.pid, *_children(proc.pid)], f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            await proc.wait()
