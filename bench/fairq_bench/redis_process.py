"""A throw-away ``redis-server`` on a free loopback port, for tests, benchmarks and the demo.

Runs with persistence off (``--save ''``, ``--appendonly no``) in a temporary directory, so a
restart starts empty: exactly the "Redis restarted empty" failure the cluster must survive.
With ``tls=True`` it serves TLS only, with a certificate from a throw-away CA (made with the
``openssl`` command) that :attr:`RedisProcess.ca_file` names.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
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
        tls: serve TLS only (``rediss://``), certified by a CA made for it.

    """

    def __init__(self, password: str = "", *, tls: bool = False) -> None:
        binary = redis_server_path()
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        self._binary = binary
        self._dir = tempfile.TemporaryDirectory(prefix="fairq-redis-")
        self.port = _free_port()
        self.password = password
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        if tls:
            _make_certificates(Path(self._dir.name))

    @property
    def url(self) -> str:
        """``redis[s]://[:password@]127.0.0.1:port/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    @property
    def ca_file(self) -> str:
        """The CA certificate that signed the server's (TLS only)."""
        return str(Path(self._dir.name) / "ca.crt")

    def start(self, timeout: float = 10.0) -> None:
        """Start it (empty) and wait until it accepts connections."""
        args = [
            self._binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", self._dir.name, "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        if self.tls:
            d = Path(self._dir.name)
            args[1:3] = ["--port", "0", "--tls-port", str(self.port)]
            args += [
                "--tls-cert-file", str(d / "server.crt"), "--tls-key-file", str(d / "server.key"),
                "--tls-ca-cert-file", self.ca_file, "--tls-auth-clients", "no",
            ]  # fmt: skip
        log = open(Path(self._dir.name) / "redis.log", "ab")  # noqa: SIM115 - the child's
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            with contextlib.suppress(OSError):
                if self._answers():
                    return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start within {timeout} s: {self.log_tail()}")

    def _answers(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as raw:
            conn = raw
            if self.tls:
                context = ssl.create_default_context(cafile=self.ca_file)
                conn = context.wrap_socket(raw, server_hostname="127.0.0.1")
            conn.sendall(b"PING\r\n")
            # +PONG, or -NOAUTH with a password: either way it is serving.
            return conn.recv(64)[:1] in (b"+", b"-")

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
    def running(cls, password: str = "", *, tls: bool = False) -> Iterator[RedisProcess]:
        """Start one, yield it, stop it."""
        server = cls(password, tls=tls)
        try:
            server.start()
            yield server
        finally:
            server.close()


def _make_certificates(directory: Path) -> None:
    """Write ``ca.crt`` and a ``server.crt`` / ``server.key`` for 127.0.0.1 it signed."""
    if shutil.which("openssl") is None:
        raise RuntimeError("a TLS redis-server needs the openssl command (apt-get install openssl)")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=fairq-test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "san.cnf", "-out", "server.crt")  # fmt: skip
