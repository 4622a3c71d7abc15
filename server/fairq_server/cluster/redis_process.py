"""A throw-away ``redis-server`` on a free loopback port, for tests, benchmarks and the demo.

Runs with persistence off (``--save ''``, ``--appendonly no``) in a temporary directory, so a
restart starts empty: exactly the "Redis restarted empty" failure the cluster must survive.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["INSTALL_HINT", "RedisProcess", "redis_server_path"]

INSTALL_HINT = (
    "redis-server is not installed; on Debian/Ubuntu run `apt-get install -y redis-server` "
    "(as root), on macOS `brew install redis`; CI (.ci/run) installs it"
)


def redis_server_path() -> str | None:
    """Where ``redis-server`` is, or None."""
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisProcess:
    """One ``redis-server`` child; :meth:`stop` and :meth:`start` keep the same port.

    Args:
        password: ``requirepass`` (empty: none).

    """

    def __init__(self, password: str = "") -> None:
        binary = redis_server_path()
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self._binary = binary
        self._dir = tempfile.TemporaryDirectory(prefix="fairq-redis-")
        self.port = _free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:port/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start it (empty) and wait until it accepts connections."""
        args = [
            self._binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", self._dir.name, "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        log = open(Path(self._dir.name) / "redis.log", "ab")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s,
            ):
                s.sendall(b"PING\r\n")
                # +PONG, or -NOAUTH with a password: either way it is serving.
                if s.recv(64)[:1] in (b"+", b"-"):
                    return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start within {timeout} s: {self.log_tail()}")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL); what it held is gone (no persistence)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        """Stop it and remove its directory."""
        self.stop()
        self._dir.cleanup()

    def log_tail(self, chars: int = 2000) -> str:
        """Return the end of its log."""
        path = Path(self._dir.name) / "redis.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    @classmethod
    @contextlib.contextmanager
    def running(cls, password: str = "") -> Iterator[RedisProcess]:
        """Start one, yield it, stop it."""
        server = cls(password)
        try:
            server.start()
            yield server
        finally:
            server.close()
