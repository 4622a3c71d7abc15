"""A throw-away PostgreSQL server on a free loopback port, for tests and benchmarks.

Debian's PostgreSQL binaries (``/usr/lib/postgresql/<version>/bin``) make a cluster in a
temporary directory (``initdb -A trust``: no passwords on loopback) and run it with its own
port and socket directory, so it never meets a system PostgreSQL. PostgreSQL refuses to run as
root: as root, the cluster belongs to the ``postgres`` user and its commands run as that user.
:meth:`PostgresProcess.stop` and :meth:`PostgresProcess.start` keep the data and the port,
which is what a database restart in a fault test needs. Durability settings are relaxed
(``fsync = off``): a stop is always a clean shutdown here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["INSTALL_HINT", "PostgresProcess", "postgres_bin_dir"]

INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not installed; on Debian/Ubuntu run "
    "`apt-get install -y postgresql` (as root), on macOS `brew install postgresql`; CI "
    "(.ci/run) installs them"
)
_SUPERUSER = "postgres"


def postgres_bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are (the newest Debian version, else on PATH), or None."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresProcess:
    """One PostgreSQL cluster in a temporary directory, started and stopped with ``pg_ctl``."""

    def __init__(self) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError(INSTALL_HINT)
        self._bin = bin_dir
        self._as_root = os.geteuid() == 0
        self._tmp = tempfile.mkdtemp(prefix="fairq-postgres-")
        if self._as_root:  # the cluster, its log and its socket belong to the postgres user
            shutil.chown(self._tmp, _SUPERUSER, _SUPERUSER)
        self.dir = Path(self._tmp)
        self.data = self.dir / "data"
        self.port = _free_port()
        self._initialised = False
        self.running = False

    def url(self, database: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:port/database``."""
        return f"postgresql://{_SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        command = [str(self._bin / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", _SUPERUSER, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)

    def _initdb(self) -> None:
        self.data.mkdir()
        if self._as_root:
            shutil.chown(self.data, _SUPERUSER, _SUPERUSER)
            os.chmod(self.data, 0o700)
        done = self._run("initdb", "-A", "trust", "-U", _SUPERUSER, "-E", "UTF8",
                         "--no-locale", "-D", str(self.data))  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-2000:]}")
        self._initialised = True

    def start(self, timeout: float = 30.0) -> None:
        """Start the server (making the cluster the first time) and wait until it accepts."""
        if not self._initialised:
            self._initdb()
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "postgres.log"),
                         "-o", options, "-w", "-t", str(int(timeout)), "start",
                         timeout=timeout + 10)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()} {self.log_tail()}")
        self.running = True

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed); the data stays."""
        if not self.running:
            return
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.running = False

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its URL."""
        done = self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", _SUPERUSER,
                         name)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"createdb {name} failed: {done.stderr.strip()}")
        return self.url(name)

    def log_tail(self, chars: int = 2000) -> str:
        """Return the end of the server's log."""
        path = self.dir / "postgres.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)

    @classmethod
    @contextlib.contextmanager
    def running_server(cls) -> Iterator[PostgresProcess]:
        """Start one, yield it, stop it and remove its data."""
        server = cls()
        try:
            server.start()
            yield server
        finally:
            server.close()
