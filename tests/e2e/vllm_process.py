"""Run a real vLLM OpenAI-compatible server as a child process for end-to-end tests.

The server runs in its own process group (vLLM forks an engine core, a worker and a
multiprocessing resource tracker) but in the caller's session (see ``_start_once``). Stopping
it signals the whole group: SIGTERM first, SIGKILL after a grace period, and
:meth:`VllmProcess.stop` only returns once no live member of the group is left, so no test run
leaves an engine behind. If the test runner itself dies, the server gets SIGTERM from the
kernel (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final, Self

import httpx

__all__ = [
    "VLLM_PYTHON_ENV",
    "VllmProcess",
    "VllmStartupError",
    "find_vllm_python",
]

#: Names the python of a venv with vLLM installed (``make test-vllm`` sets it).
VLLM_PYTHON_ENV: Final = "FAIRQ_VLLM_PYTHON"
_FALLBACK_PYTHON: Final = Path("/work/vllm-venv/bin/python")

_SERVED_MODEL: Final = "tiny"
_MAX_MODEL_LEN: Final = 512
_PORT_ATTEMPTS: Final = 3

# Offline and quiet: there is nothing to download, and tests must not phone home.
_BASE_ENV: Final = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # GiB of KV cache; vLLM's CPU default is sized for real models and host RAM.
    "VLLM_CPU_KVCACHE_SPACE": "1",
}


class VllmStartupError(RuntimeError):
    """vLLM exited or did not report healthy in time; the message ends with its log tail."""


def find_vllm_python() -> Path | None:
    """Return the python of the vLLM venv, or ``None`` when there is none on this machine.

    ``$FAIRQ_VLLM_PYTHON`` wins when set (even if it points nowhere, so a CI misconfiguration
    is not papered over by a local fallback); otherwise ``/work/vllm-venv/bin/python``.
    """
    configured = os.environ.get(VLLM_PYTHON_ENV)
    candidate = Path(configured) if configured else _FALLBACK_PYTHON
    return candidate if candidate.is_file() else None


class VllmProcess:
    """One vLLM server serving the tiny model as ``tiny`` on ``127.0.0.1``.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with VllmProcess(python, model_dir, log_path, extra_args=["--max-num-seqs", "4"]) as v:
            httpx.get(f"{v.url}/health")
    """

    model: Final = _SERVED_MODEL

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        log_path: Path,
        *,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        cpus: Sequence[int] = (),
        nice: int = 0,
    ) -> None:
        """Describe the server; nothing runs until :meth:`start`.

        Args:
            python: Interpreter of a venv with vLLM installed.
            model_dir: Directory from :func:`tiny_model.build_tiny_model`.
            log_path: File that receives the server's stdout and stderr.
            extra_args: Appended to the command line, e.g. ``["--max-num-seqs", "4"]``.
            env: Extra environment variables, applied over the defaults.
            startup_timeout_s: How long to wait for ``/health``; a cold start compiles the
                model with torch inductor, which takes about a minute on two cores.
            cpus: Confine every vLLM process (API server, engine core, model worker and its
                OpenMP threads) to these cores, as an engine on its own GPU host would be; a
                CPU engine's threads stall whenever another process takes their core, which
                a GPU deployment never sees. Empty: no confinement.
            nice: Scheduling priority of every vLLM process (negative needs root); a
                benchmark on a machine with other tenants keeps them off the engine's core.
        """
        self.python = python
        self.model_dir = model_dir
        self.log_path = log_path
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.cpus = tuple(cpus)
        self.nice = nice
        self.port: int | None = None
        #: Seconds from spawn to the first healthy ``/health`` (of the successful attempt).
        self.startup_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL such as ``http://127.0.0.1:41234`` (no trailing slash, no ``/v1``)."""
        if self.port is None:
            raise RuntimeError("vLLM is not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Spawn vLLM and block until ``/health`` answers 200.

        Raises:
            VllmStartupError: The server exited, or was not healthy within the timeout.
        """
        if self._proc is not None:
            raise RuntimeError("vLLM is already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                self._start_once()
                return self
            except VllmStartupError:
                self.stop()
                # The free port we picked can be taken before vLLM binds it; only that is
                # worth another try, everything else would fail the same way again.
                if attempt == _PORT_ATTEMPTS or "address already in use" not in self._tail():
                    raise
        raise AssertionError("unreachable")

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``grace_s``.

        Idempotent. Returns only when no live process of the group remains.

        Raises:
            RuntimeError: Processes survived SIGKILL (should not happen; reported, not hidden).
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                self._signal_group(proc.pid, signal.SIGTERM)
                if not _wait_group_gone(proc, grace_s):
                    self._signal_group(proc.pid, signal.SIGKILL)
                    if not _wait_group_gone(proc, 10.0):
                        survivors = _live_group_members(proc.pid)
                        raise RuntimeError(f"vLLM processes survived SIGKILL: {survivors}")
            finally:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 40) -> str:
        """Return the last ``lines`` lines of the server log (for failure messages)."""
        return self._tail(lines)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start_once(self) -> None:
        self.port = _free_port()
        pin = ["taskset", "-c", ",".join(map(str, self.cpus))] if self.cpus else []
        niced = ["nice", "-n", str(self.nice)] if self.nice else []
        cmd = [
            *niced,
            *pin,
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--load-format",
            "dummy",
            "--served-model-name",
            self.model,
            "--max-model-len",
            str(_MAX_MODEL_LEN),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        self._log = self.log_path.open("ab")
        self._log.write(f"\n$ {' '.join(cmd)}\n".encode())
        self._log.flush()
        started = time.monotonic()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.log_path.parent,  # vLLM may drop files in its cwd; keep them out of the repo
            env=self._child_env(),
            # Own process group, so stop() reaches the engine too, but the *same session*:
            # with start_new_session the server lands in its own scheduler autogroup, and on
            # our 2-vCPU test VM (kernel 6.18, autogroup on) that group starved every other
            # process, the measuring client included, for 6-8 s during a flood.
            process_group=0,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self._wait_healthy(started)
        self.startup_s = time.monotonic() - started

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The test runner's own venv must not leak into vLLM's interpreter.
        for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
            env.pop(name, None)
        env.update(_BASE_ENV)
        if self.cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, self.cpus))
        env.update(self.env)
        return env

    def _wait_healthy(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise VllmStartupError(self._failure(f"vLLM exited with code {code}"))
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise VllmStartupError(
                        self._failure(f"vLLM not healthy after {self.startup_timeout_s:.0f} s")
                    )
                time.sleep(0.5)

    def _failure(self, reason: str) -> str:
        return f"{reason}; log {self.log_path}, last lines:\n{self._tail()}"

    def _tail(self, lines: int = 40) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Runs in the child before exec: get SIGTERM if the test runner dies (even by SIGKILL).

    Without this a killed pytest leaves a vLLM server holding a core on a shared machine;
    vLLM propagates the shutdown to its own children.
    """
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _wait_group_gone(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()  # reap the leader, or it stays a zombie member of the group
        if not _live_group_members(proc.pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _live_group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that are not zombies.

    Zombies are skipped: reparented children are reaped by whatever runs as PID 1, which in a
    container may be slow or never, and a zombie holds no resources worth waiting for.
    """
    proc_root = Path("/proc")
    if not proc_root.is_dir():  # not Linux: fall back to "does any member exist?"
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Fields after "(comm)": state, ppid, pgrp, ...; comm may itself contain spaces.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
