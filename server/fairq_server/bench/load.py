"""Load and soak: fairq as a child process under thousands of streams, measured from outside.

Run ``python -m fairq_server.bench.load [--quick]``. The simulator and fairq run as child
processes (``fairq sim``, ``fairq serve``), the load generator is this process, and a fourth
process probes fairq's event loop. Nothing is added to the server: every figure is read from
outside, from ``/proc/<pid>/status``, fairq's own ``/metrics`` and the gRPC responses.

Phases:

1. **Capacity**: ``streams`` requests run at once on the backend (fairq caps the backend at that
   many in flight) while ``queued`` more from ``users`` users wait in fairq's queue. fairq's
   resident memory is read before and after the queue fills (bytes per queued request), and a
   separate prober times a gRPC health ``Check`` every 20 ms: the slowest answer bounds the
   longest event-loop stall of fairq. Every request must end with exactly one terminal event:
   a ``finished`` event and a clean end of stream, or an error status (never both, never
   neither).
2. **Soak**: for a bounded time, open-loop traffic mixed with faults: the backend killed and
   restarted (``SIGKILL``, same port), restarts with an error rate, clients cancelling mid
   stream and requests with short deadlines. At the end fairq must be back to baseline: no
   request in its queue, nothing in flight on any backend, and resident memory within a
   bound of where it was after a warm-up round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import re
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import grpc
import httpx
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_server.bench.report import markdown_table, percentile
from fairq_server.sim.profiles import PROFILES

__all__ = [
    "FULL",
    "QUICK",
    "CapacityResult",
    "ChildProcess",
    "LoadSize",
    "Prober",
    "SoakResult",
    "capacity",
    "free_port",
    "main",
    "process_group_alive",
    "soak",
    "start_child",
    "start_fairq",
    "start_sim",
]

_READY_TIMEOUT = 60.0


# -- child processes ----------------------------------------------------------------------


@dataclass
class ChildProcess:
    """A ``python -m fairq_server ...`` child in its own process group.

    Attributes:
        proc: the process.
        address: what it printed when ready (the sim's URL, fairq's ``host:port`` target).
        args: its command-line arguments after ``-m fairq_server``.
        log: its stderr, kept in a temporary file (a pipe nobody drains would block it).
        workdir: a directory that lives as long as the child (fairq's configuration file).

    """

    proc: asyncio.subprocess.Process
    address: str
    args: tuple[str, ...]
    log: IO[bytes]
    workdir: tempfile.TemporaryDirectory[str] | None = None
    metrics_url: str = ""
    drainer: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """Process id (also the process group id)."""
        return self.proc.pid

    def rss_bytes(self) -> int:
        """Resident set size from ``/proc/<pid>/status`` (VmRSS)."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if match is None:
            raise RuntimeError(f"no VmRSS for pid {self.pid}")
        return int(match.group(1)) * 1024

    def cpu_seconds(self) -> float:
        """User + system CPU time consumed so far, from ``/proc/<pid>/stat``."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stderr_tail(self, chars: int = 3000) -> str:
        """The end of what the child wrote to stderr."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-chars:]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group: the crash of a backend, no goodbye on any socket."""
        self.signal(signal.SIGKILL)

    async def wait(self, timeout: float) -> int:
        """Wait for the child to exit and return its exit status.

        Raises:
            TimeoutError: it is still running after ``timeout`` seconds.

        """
        async with asyncio.timeout(timeout):
            return await self.proc.wait()

    async def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit status."""
        if self.proc.returncode is None:
            self.signal(signal.SIGTERM)
            try:
                await self.wait(timeout)
            except TimeoutError:
                self.kill()
                await self.proc.wait()
        if self.drainer is not None:
            await self.drainer
        if self.workdir is not None:
            self.workdir.cleanup()
        self.log.close()
        assert self.proc.returncode is not None
        return self.proc.returncode


def process_group_alive(pgid: int) -> bool:
    """Whether any process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


async def start_child(
    args: Sequence[str],
    ready: str,
    *,
    workdir: tempfile.TemporaryDirectory[str] | None = None,
    module: str = "fairq_server",
) -> ChildProcess:
    """Start ``python -m MODULE ARGS`` and wait for a stdout line matching ``ready``.

    The child gets its own process group (signals reach all of it) but stays in our session:
    a new session is a new scheduler autogroup, which on a small machine starves this process.

    Raises:
        RuntimeError: the child exited or printed nothing matching within 60 s.

    """
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        process_group=0,
    )
    child = ChildProcess(proc, "", tuple(args), log, workdir)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(_READY_TIMEOUT):
            while line := (await proc.stdout.readline()).decode():
                if match := re.search(ready, line):
                    child.address = match.group(1)
                    break
    except TimeoutError:
        pass
    if not child.address:
        err = child.stderr_tail()
        await child.stop()
        raise RuntimeError(f"fairq {args[0]} did not start: {err}")
    # The children print little after their ready line, but a pipe left unread would block
    # a chatty one, so keep draining it.
    child.drainer = asyncio.create_task(_drain(proc.stdout))
    return child


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def start_sim(*args: str, port: int = 0) -> ChildProcess:
    """Run ``fairq sim ARGS`` on ``port`` (0 = a free one); ``address`` is its base URL."""
    return await start_child(["sim", "--port", str(port), *args], r"^(http://\S+)")


async def start_fairq(
    config_text: str, *, grace: float = 2.0, metrics: bool = False, log_level: str = "WARNING"
) -> ChildProcess:
    """Run ``fairq serve`` with ``config_text``; ``address`` is its gRPC target.

    With ``metrics``, ``metrics_listen`` is set to a free loopback port (prepended to the
    configuration, which must not set it) and ``metrics_url`` points at its ``/metrics``.
    """
    metrics_url = ""
    if metrics:
        port = free_port()
        config_text = f'metrics_listen = "127.0.0.1:{port}"\n{config_text}'
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    workdir = tempfile.TemporaryDirectory(prefix="fairq-load-")
    path = Path(workdir.name) / "fairq.toml"
    path.write_text(config_text)
    child = await start_child(
        ["--log-level", log_level, "serve", "--config", str(path), "--grace", str(grace)],
        r"\(port (\d+)\)",
        workdir=workdir,
    )
    child.address = f"127.0.0.1:{child.address}"
    child.metrics_url = metrics_url
    return child


def free_port() -> int:
    """A TCP port free on loopback right now (another process could take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- reading fairq and the simulator from outside -----------------------------------------

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient, url: str) -> Samples:
    """Every sample of a Prometheus ``/metrics`` endpoint."""
    text = (await client.get(url, timeout=10.0)).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


async def fairq_quiet(client: httpx.AsyncClient, fairq: ChildProcess) -> Samples:
    """fairq's metrics once nothing is queued and nothing is in flight on any backend.

    Raises:
        TimeoutError: fairq did not get there within 60 s (a leak of queue or slot state).

    """
    async with asyncio.timeout(60):
        while True:
            samples = await scrape(client, fairq.metrics_url)
            busy = total(samples, "fairq_queue_depth") + total(samples, "fairq_backend_in_flight")
            if busy == 0:
                return samples
            await asyncio.sleep(0.2)  # another process's state: nothing to await


# -- the event-loop prober (a process of its own) ------------------------------------------


@dataclass(frozen=True)
class ProbeStats:
    """Latency of fairq's health ``Check`` over a window, next to an idle control server's.

    ``max`` bounds fairq's longest event-loop stall from above; on a shared machine it also
    holds every moment the prober or fairq was not scheduled at all. The control server, a
    bare gRPC health server in its own process, is probed at the same instants: ``excess``
    is fairq's latency minus the control's, probe by probe, a tighter bound on what fairq
    itself adds.
    """

    count: int = 0
    failures: int = 0
    p50: float = math.nan
    p99: float = math.nan
    max: float = math.nan
    control_p99: float = math.nan
    control_max: float = math.nan
    excess_p99: float = math.nan
    excess_max: float = math.nan
    worst: tuple[tuple[float, float], ...] = ()  # (seconds into the window, latency), top 3


class Prober:
    """Probes fairq and a control server from a process of its own; collects the samples.

    The prober lives in its own process so that the load generator's busy event loop does
    not add its own delays to the measurement. It prints one line per tick,
    ``<monotonic time> <fairq seconds> <ok> <control seconds> <ok>``; ``CLOCK_MONOTONIC`` is
    shared by all processes, so the load generator cuts windows with its own clock.
    """

    def __init__(self, proc: asyncio.subprocess.Process, control: ChildProcess) -> None:
        self._proc = proc
        self._control = control
        self.samples: list[tuple[float, float, bool, float]] = []
        assert proc.stdout is not None
        self._reader = asyncio.create_task(self._read(proc.stdout))

    @classmethod
    async def start(cls, target: str, interval: float = 0.02) -> Prober:
        """Start probing ``target`` (and a fresh control server) every ``interval`` seconds."""
        control = await start_child(
            ["--control-server"], r"port (\d+)", module="fairq_server.bench.load"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fairq_server.bench.load", "--probe", target,
            "--probe-control", f"127.0.0.1:{control.address}",
            "--probe-interval", str(interval),
            stdout=asyncio.subprocess.PIPE, process_group=0,
        )  # fmt: skip
        return cls(proc, control)

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            at, latency, ok, control, _ = line.split()
            self.samples.append((float(at), float(latency), ok == b"1", float(control)))

    def stats(self, start: float, end: float) -> ProbeStats:
        """Statistics of the probes sent in ``[start, end]`` (monotonic seconds)."""
        window = [x for x in self.samples if start <= x[0] <= end]
        if not window:
            return ProbeStats()
        latencies = sorted(x[1] for x in window)
        control = sorted(x[3] for x in window)
        excess = sorted(max(0.0, x[1] - x[3]) for x in window)
        return ProbeStats(
            count=len(window),
            failures=sum(not x[2] for x in window),
            p50=percentile(latencies, 50),
            p99=percentile(latencies, 99),
            max=latencies[-1],
            control_p99=percentile(control, 99),
            control_max=control[-1],
            excess_p99=percentile(excess, 99),
            excess_max=excess[-1],
            worst=tuple((x[0] - start, x[1]) for x in sorted(window, key=lambda x: -x[1])[:3]),
        )

    async def stop(self) -> None:
        """Stop the prober and the control server (idempotent)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        await self._proc.wait()
        await self._reader
        await self._control.stop()


async def probe_forever(target: str, control: str, interval: float) -> None:
    """Time a health ``Check`` against ``target`` and ``control`` at once, every ``interval``
    seconds on a fixed schedule, and print one line per tick."""

    async def check(stub: health_pb2_grpc.HealthStub) -> tuple[float, bool]:
        sent = time.monotonic()
        try:
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=5.0)
        except grpc.aio.AioRpcError:
            return time.monotonic() - sent, False
        return time.monotonic() - sent, True

    async with (
        grpc.aio.insecure_channel(target) as fairq_channel,
        grpc.aio.insecure_channel(control) as control_channel,
    ):
        stubs = (
            health_pb2_grpc.HealthStub(fairq_channel),
            health_pb2_grpc.HealthStub(control_channel),
        )
        next_at = time.monotonic()
        while True:
            at = time.monotonic()
            (lat, ok), (c_lat, c_ok) = await asyncio.gather(check(stubs[0]), check(stubs[1]))
            sys.stdout.write(f"{at:.6f} {lat:.6f} {int(ok)} {c_lat:.6f} {int(c_ok)}\n")
            sys.stdout.flush()
            # Fixed rate; after a slow answer the next probe goes at once, without a burst.
            next_at = max(next_at + interval, time.monotonic() - interval)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def control_server() -> None:
    """A bare gRPC server with the health service: the prober's reference point."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"control server on port {port}", flush=True)
    await server.wait_for_termination()


# -- one request and its terminal event ------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One request of the load.

    Attributes:
        user: fairness identity (``x-fairq-user``).
        max_tokens: exact output length (``ignore_eos``).
        cancel_after: the client cancels after this many chunks (None: reads to the end).
        timeout: gRPC deadline in seconds (None: none).

    """

    user: str
    max_tokens: int
    cancel_after: int | None = None
    timeout: float | None = None


@dataclass
class Outcome:
    """What one request saw, in order; ``code`` is its final status name.

    ``CLIENT_CANCELLED`` means the client itself left the stream (not a server answer).
    """

    code: str = "OK"
    details: str = ""
    events: int = 0
    queued: int = 0
    started: int = 0
    chunks: int = 0
    finished: int = 0
    after_finished: int = 0
    first: str = ""

    @property
    def terminal_ok(self) -> bool:
        """Exactly one terminal event: a ``finished`` and a clean end, or an error status."""
        if self.code == "OK":
            return self.finished == 1 and self.after_finished == 0
        return self.finished == 0 or self.deadline_race

    @property
    def deadline_race(self) -> bool:
        """``finished`` came, then the call's own deadline struck before the OK status did.

        gRPC sends the last message and the status separately, and the client's deadline
        timer may fire between them: the client reports DEADLINE_EXCEEDED although the
        request completed. Counted apart, not as a violation of fairq's contract.
        """
        return self.code == "DEADLINE_EXCEEDED" and self.finished == 1 and not self.after_finished


class Tally:
    """Outcomes of many requests; counts of each final status and of contract violations."""

    def __init__(self) -> None:
        self.codes: Counter[str] = Counter()
        self.violations: list[Outcome] = []
        self.repeated_started = 0
        self.deadline_races = 0  # see Outcome.deadline_race
        self.unavailable: Counter[str] = Counter()
        self.examples: dict[str, str] = {}  # the first message seen for each error status
        self.reached_server = 0
        self.progress: Counter[str] = Counter()
        self._changed = asyncio.Condition()

    def add(self, outcome: Outcome) -> None:
        """Record a finished request."""
        self.codes[outcome.code] += 1
        if outcome.code not in ("OK", "CLIENT_CANCELLED") and outcome.code not in self.examples:
            self.examples[outcome.code] = outcome.details
        self.repeated_started += outcome.started > 1
        # When UNAVAILABLE struck. Dispatched but failed before any text is what the design
        # retries on another backend, so with a healthy one available it should be rare.
        if outcome.code == "UNAVAILABLE":
            when = (
                "mid-stream" if outcome.chunks else "before text" if outcome.started else "queued"
            )
            self.unavailable[when] += 1
        # Surely seen by fairq's servicer (a deadline or our own cancel may beat it there).
        self.reached_server += bool(outcome.events) or outcome.code not in (
            "DEADLINE_EXCEEDED",
            "CLIENT_CANCELLED",
            "CANCELLED",
        )
        self.deadline_races += outcome.deadline_race
        if not outcome.terminal_ok or (outcome.events and outcome.first != "queued"):
            self.violations.append(outcome)

    async def note(self, what: str) -> None:
        """Count a progress event (``queued``, ``started``) and wake :meth:`wait_for`."""
        self.progress[what] += 1
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, what: str, count: int, timeout: float) -> None:
        """Wait until ``count`` progress events ``what`` were seen.

        Raises:
            TimeoutError: not within ``timeout`` seconds.

        """
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.progress[what] >= count)


async def send(
    channel: grpc.aio.Channel,
    spec: Spec,
    tally: Tally,
    prompt: str,
    admission: asyncio.Semaphore | None = None,
) -> Outcome:
    """Run one request to its end (or the client's cancel) and record it in ``tally``.

    With ``admission``, the call holds one of its permits from before it is sent until fairq
    answers its first event: this bounds the calls fairq has not yet accepted (see
    :data:`ADMISSION_WINDOW`).
    """
    request = scheduler_pb2.GenerateRequest(
        model=MODEL,
        prompt=prompt,
        sampling=scheduler_pb2.SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
    )
    out = Outcome()
    holding = admission is not None
    if admission is not None:
        await admission.acquire()
    call = scheduler_pb2_grpc.SchedulerStub(channel).Generate(
        request, metadata=(("x-fairq-user", spec.user),), timeout=spec.timeout
    )
    try:
        while (response := await call.read()) is not grpc.aio.EOF:
            assert isinstance(response, scheduler_pb2.GenerateResponse)
            if not out.events:
                await tally.note("answered")
            if holding and admission is not None:
                admission.release()
                holding = False
            kind = response.WhichOneof("event") or ""
            out.events += 1
            out.first = out.first or kind
            if out.finished:
                out.after_finished += 1
            if kind == "queued":
                out.queued += 1
                await tally.note("queued")
            elif kind == "started":
                out.started += 1
                await tally.note("started")
            elif kind == "chunk":
                out.chunks += 1
                if spec.cancel_after is not None and out.chunks >= spec.cancel_after:
                    call.cancel()
                    out.code = "CLIENT_CANCELLED"
                    break
            elif kind == "finished":
                out.finished += 1
    except grpc.aio.AioRpcError as exc:
        out.code, out.details = exc.code().name, exc.details() or ""
    except asyncio.CancelledError:
        call.cancel()
        raise
    finally:
        if holding and admission is not None:
            admission.release()
    tally.add(out)
    if not out.events:
        await tally.note("answered")
    await tally.note("ended")
    return out


def channels(target: str, count: int) -> list[grpc.aio.Channel]:
    """``count`` channels to ``target``, each with its own TCP connection."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    return [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]


def prompt_for(user: str, n: int) -> str:
    """A short prompt, distinct per request (no accidental prefix sharing across users)."""
    return f"{user} asks question {n}: what is fair queueing?"


# -- phase 1: capacity ------------------------------------------------------------------------

MODEL = "sim"
PROFILE = "llama-8b-gpu"
SHORT_TOKENS = 8
# gRPC core rejects (CANCELLED) new calls at random once more than ~1000 wait for the
# application to accept them ("grpc.server.max_pending_requests", hard limit 3000), and
# fairq keeps the defaults. The load generator therefore ramps up: at most this many calls
# are sent and not yet answered at any time. `burst()` measures the unpaced case.
ADMISSION_WINDOW = 500


@dataclass(frozen=True)
class LoadSize:
    """Sizes of a run.

    Attributes:
        streams: requests running at once on the backend (fairq's ``max_in_flight`` for it).
        queued: requests waiting in fairq's queue behind them.
        users: distinct users sending them.
        hold_seconds: how long the running streams last (covers filling the queue).
        speed: the simulator's clock factor (lower = fewer tokens per second to relay).
        soak_seconds: length of the soak, in rounds of ``round_seconds``.
        round_seconds: one round of soak traffic and one fault.
        soak_rate: soak arrivals per second.
        soak_speed: the soak's simulators' clock factor.
        churn_users: after the soak, this many requests each from a new user (0: skip).
        channels: client channels (TCP connections) to fairq.

    """

    streams: int = 2_000
    queued: int = 20_000
    users: int = 1_000
    hold_seconds: float = 150.0
    speed: float = 0.25
    soak_seconds: float = 180.0
    round_seconds: float = 15.0
    soak_rate: float = 40.0
    soak_speed: float = 1.0
    churn_users: int = 20_000
    channels: int = 16


FULL = LoadSize()
QUICK = LoadSize(
    streams=200,
    queued=2_000,
    users=100,
    hold_seconds=12.0,
    soak_seconds=30.0,
    round_seconds=10.0,
    soak_rate=25.0,
    churn_users=2_000,
    channels=4,
)


@dataclass
class CapacityResult:
    """Figures of the capacity phase."""

    size: LoadSize
    tally: Tally
    peak_in_flight: float = 0.0
    peak_backend_running: float = 0.0
    peak_queue_depth: float = 0.0
    rss_idle: int = 0
    rss_streams: int = 0
    rss_queued: int = 0
    queue_fill_seconds: float = 0.0
    stream_start_seconds: float = 0.0
    total_seconds: float = 0.0
    fairq_cpu_seconds: float = 0.0
    server_outcomes: float = 0.0
    probe: ProbeStats | None = None
    probe_queue_fill: ProbeStats | None = None
    quiet_after: bool = False
    first_wave_seconds: float = math.nan

    @property
    def bytes_per_queued(self) -> float:
        """fairq's resident memory per queued request."""
        return (self.rss_queued - self.rss_streams) / max(1, self.size.queued)

    @property
    def bytes_per_stream(self) -> float:
        """fairq's resident memory per running stream (over the idle process)."""
        return (self.rss_streams - self.rss_idle) / max(1, self.size.streams)


def _step_seconds(streams: int, speed: float) -> float:
    profile = PROFILES[PROFILE]
    return (profile.alpha + profile.beta * streams) / speed


def _capacity_config(size: LoadSize, sim_url: str) -> str:
    # The gate's pacing is not under test here: thresholds are opened wide and the backend
    # is capped by max_in_flight, so exactly `streams` run and the rest wait in fairq.
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\n"
        "stale_after_seconds = 5.0\n"
        f"max_queued_per_user = {size.queued + size.streams}\n"
        f"max_queued_total = {size.queued + size.streams}\n"
        "queue_ttl_seconds = 3600.0\n"
        '[[tiers]]\nname = "interactive"\n'
        f"max_backend_waiting = {10 * (size.queued + size.streams)}\n"
        "tpot_limit_seconds = 3600.0\n"
        "[[backends]]\n"
        f'id = "sim"\nkind = "vllm"\nbase_url = "{sim_url}"\nmodels = ["{MODEL}"]\n'
        f"max_in_flight = {size.streams}\n"
    )


async def _watch(
    client: httpx.AsyncClient,
    urls: tuple[str, str],
    result: CapacityResult,
    log: Callable[[str], None],
) -> None:
    """Track the peaks of fairq's in-flight count and queue depth, and of the simulator's
    running count (``urls``: fairq's and the simulator's ``/metrics``); log every 10 s."""
    last_log = time.monotonic()
    while True:
        samples = await scrape(client, urls[0])
        in_flight = total(samples, "fairq_backend_in_flight")
        depth = total(samples, "fairq_queue_depth")
        result.peak_in_flight = max(result.peak_in_flight, in_flight)
        result.peak_queue_depth = max(result.peak_queue_depth, depth)
        running = total(await scrape(client, urls[1]), "vllm:num_requests_running")
        result.peak_backend_running = max(result.peak_backend_running, running)
        if time.monotonic() - last_log >= 10:
            last_log = time.monotonic()
            p = result.tally.progress
            log(
                f"  fairq in flight {in_flight:.0f}, queued {depth:.0f}; client saw "
                f"{p['queued']} queued, {p['started']} started, "
                f"{sum(result.tally.codes.values())} ended: {dict(result.tally.codes)}"
            )
        await asyncio.sleep(0.25)  # sampling another process's gauges


async def capacity(size: LoadSize, log: Callable[[str], None] = print) -> CapacityResult:
    """Run ``size.streams`` streams at once with ``size.queued`` requests queued behind them."""
    step = _step_seconds(size.streams, size.speed)
    hold_tokens = max(SHORT_TOKENS + 1, math.ceil(size.hold_seconds / step))
    block = PROFILES[PROFILE].block_size
    kv_blocks = math.ceil(size.streams * (hold_tokens + 64) / block * 1.5)
    result = CapacityResult(size, Tally())
    sim = await start_sim(
        "--profile",
        PROFILE,
        "--max-num-seqs",
        str(size.streams + 16),
        "--kv-blocks",
        str(kv_blocks),
        "--speed",
        str(size.speed),
    )
    fairq = await start_fairq(_capacity_config(size, sim.address), metrics=True)
    prober = await Prober.start(fairq.address)
    chans = channels(fairq.address, size.channels)
    tasks: list[asyncio.Task[Outcome]] = []
    helpers: list[asyncio.Task[None]] = []  # the watcher and the first-wave marker
    try:
        async with httpx.AsyncClient() as http:
            warm = Tally()
            await asyncio.gather(
                *(
                    send(chans[i % len(chans)], Spec(f"warm-{i}", 2), warm, prompt_for("warm", i))
                    for i in range(50)
                )
            )
            result.rss_idle = fairq.rss_bytes()
            cpu0, t0 = fairq.cpu_seconds(), time.monotonic()
            urls = (fairq.metrics_url, sim.address + "/metrics")
            helpers.append(asyncio.create_task(_watch(http, urls, result, log)))
            log(
                f"capacity: {size.streams} streams of {hold_tokens} tokens "
                f"(~{hold_tokens * step:.0f} s each)"
            )
            admission = asyncio.Semaphore(ADMISSION_WINDOW)

            def launch(i: int, spec: Spec) -> None:
                chan = chans[i % len(chans)]
                prompt = prompt_for(spec.user, i)
                tasks.append(asyncio.create_task(send(chan, spec, result.tally, prompt, admission)))

            for i in range(size.streams):
                launch(i, Spec(f"user-{i % size.users}", hold_tokens))
            await result.tally.wait_for("started", size.streams, timeout=300)
            result.stream_start_seconds = time.monotonic() - t0
            result.rss_streams = fairq.rss_bytes()
            log(
                f"capacity: {size.streams} running after {result.stream_start_seconds:.1f} s; "
                f"queueing {size.queued} from {size.users} users"
            )

            async def first_wave() -> None:
                await result.tally.wait_for("started", size.streams + 1, timeout=3600)
                result.first_wave_seconds = time.monotonic() - t0

            helpers.append(asyncio.create_task(first_wave()))
            t_fill = time.monotonic()
            for i in range(size.queued):
                launch(size.streams + i, Spec(f"user-{i % size.users}", SHORT_TOKENS))
            await result.tally.wait_for("answered", size.streams + size.queued, timeout=600)
            result.queue_fill_seconds = time.monotonic() - t_fill
            result.rss_queued = fairq.rss_bytes()
            fill_end = time.monotonic()
            if result.tally.progress["started"] > size.streams:
                log(
                    "capacity: WARNING: streams ended before the queue was full; raise hold_seconds"
                )
            log(
                f"capacity: {size.queued} queued in {result.queue_fill_seconds:.1f} s; "
                f"RSS {result.rss_streams / 2**20:.0f} -> {result.rss_queued / 2**20:.0f} MiB; "
                "draining"
            )
            await asyncio.gather(*tasks)
            result.total_seconds = time.monotonic() - t0
            result.fairq_cpu_seconds = fairq.cpu_seconds() - cpu0
            for helper in helpers:
                helper.cancel()
            samples = await fairq_quiet(http, fairq)
            result.quiet_after = True
            # fairq's own count of finalized requests, minus the warm-up ones.
            served = total(samples, "fairq_requests_total")
            result.server_outcomes = served - sum(warm.codes.values())
        await prober.stop()
        result.probe = prober.stats(t0, t0 + result.total_seconds)
        result.probe_queue_fill = prober.stats(t_fill, fill_end)
    finally:
        for task in [*tasks, *helpers]:
            task.cancel()
        await asyncio.gather(*tasks, *helpers, return_exceptions=True)
        for chan in chans:
            await chan.close()
        await prober.stop()
        await fairq.stop()
        await sim.stop()
    return result


# -- phase 2: soak with faults ------------------------------------------------------------------

FAULTS = ("none", "kill", "error-rate", "metrics-fail", "kill", "slow-metrics")


@dataclass(frozen=True)
class RoundResult:
    """One soak round: its fault, what clients saw, and fairq's state once quiet again."""

    index: int
    fault: str
    victim: str
    codes: Counter[str]
    violations: int
    sent: int
    reached_server: int
    server_outcomes: float
    unavailable: Counter[str]
    repeated_started: int
    rss: int
    probe: ProbeStats
    examples: dict[str, str] = field(default_factory=dict)
    deadline_races: int = 0
    violation_examples: tuple[Outcome, ...] = ()

    @property
    def counted_ok(self) -> bool:
        """fairq counted every request that reached it, and no more than were sent."""
        return self.reached_server <= self.server_outcomes <= self.sent


@dataclass
class SoakResult:
    """Figures of the soak."""

    size: LoadSize
    rounds: list[RoundResult] = field(default_factory=list)
    quiet_every_round: bool = True
    churn_users: int = 0
    churn_rss_known: int = 0
    churn_rss_delta: int = 0

    @property
    def rss_growth(self) -> int:
        """Resident memory after the last round minus after the first (warm-up) round."""
        return self.rounds[-1].rss - self.rounds[0].rss if self.rounds else 0


class _Backend:
    """A simulator child that can be killed and restarted on the same port."""

    def __init__(self, name: str, speed: float) -> None:
        self.name = name
        self.speed = speed
        self.port = 0
        self.child: ChildProcess | None = None

    async def start(self, *faults: str) -> None:
        self.child = await start_sim(
            "--profile", PROFILE, "--speed", str(self.speed), *faults, port=self.port
        )
        self.port = int(self.child.address.rsplit(":", 1)[1])

    async def restart(self, *faults: str) -> None:
        if self.child is not None:
            await self.child.stop()
        await self.start(*faults)

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()

    async def stop(self) -> None:
        if self.child is not None:
            await self.child.stop()


def _soak_config(urls: Sequence[tuple[str, str]]) -> str:
    backends = "".join(
        f'[[backends]]\nid = "{name}"\nkind = "vllm"\nbase_url = "{url}"\nmodels = ["{MODEL}"]\n'
        for name, url in urls
    )
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\nqueue_ttl_seconds = 20.0\nstale_after_seconds = 1.0\n" + backends
    )


async def _fault(kind: str, victim: _Backend, seconds: float) -> None:
    """Apply ``kind`` to ``victim`` for about ``seconds``, then heal it."""
    if kind == "none":
        return
    if kind == "kill":
        victim.kill()
        await asyncio.sleep(min(2.0, seconds))  # the backend stays dead this long
        await victim.restart()
        return
    flags = {
        "error-rate": ("--error-rate", "0.5"),
        "metrics-fail": ("--metrics-fail",),
        "slow-metrics": ("--metrics-delay", "3"),
    }[kind]
    await victim.restart(*flags)
    await asyncio.sleep(seconds)  # the fault lasts this long
    await victim.restart()


def _soak_spec(rng: random.Random, users: Sequence[str]) -> Spec:
    user = rng.choice(users)
    roll = rng.random()
    if roll < 0.1:
        return Spec(user, rng.randint(16, 64), cancel_after=rng.randint(1, 8))
    if roll < 0.2:
        return Spec(user, rng.randint(8, 64), timeout=rng.uniform(0.05, 1.5))
    return Spec(user, rng.randint(4, 48))


async def soak(size: LoadSize, log: Callable[[str], None] = print, seed: int = 1) -> SoakResult:
    """Open-loop traffic in rounds, each with one fault; fairq must be quiet after each."""
    rng = random.Random(seed)
    result = SoakResult(size)
    backends = [_Backend("sim-a", size.soak_speed), _Backend("sim-b", size.soak_speed)]
    for backend in backends:
        await backend.start()
    urls = [(b.name, f"http://127.0.0.1:{b.port}") for b in backends]
    fairq = await start_fairq(_soak_config(urls), metrics=True)
    prober = await Prober.start(fairq.address)
    chans = channels(fairq.address, size.channels)
    rounds = max(2, math.ceil(size.soak_seconds / size.round_seconds))
    try:
        async with httpx.AsyncClient() as http:
            before = total(await scrape(http, fairq.metrics_url), "fairq_requests_total")
            for index in range(rounds):
                fault = FAULTS[index % len(FAULTS)] if index else "none"
                victim = backends[index % 2]
                # New users every round: per-user state must not outlive its users.
                users = [f"soak-{index}-{u}" for u in range(max(4, size.users // 10))]
                tally = Tally()
                started = time.monotonic()
                tasks: list[asyncio.Task[Outcome]] = []
                fault_task = asyncio.create_task(
                    _delayed(
                        0.3 * size.round_seconds, _fault(fault, victim, 0.4 * size.round_seconds)
                    )
                )
                n = 0
                while time.monotonic() < started + size.round_seconds:
                    burst = 1 if rng.random() > 0.02 else int(size.soak_rate * 5)
                    for _ in range(burst):
                        spec = _soak_spec(rng, users)
                        tasks.append(
                            asyncio.create_task(
                                send(chans[n % len(chans)], spec, tally, prompt_for(spec.user, n))
                            )
                        )
                        n += 1
                    # Open loop: arrivals follow the clock, not completions.
                    await asyncio.sleep(rng.expovariate(size.soak_rate))
                await fault_task
                async with asyncio.timeout(120):
                    await asyncio.gather(*tasks)
                try:
                    samples = await fairq_quiet(http, fairq)
                except TimeoutError:
                    result.quiet_every_round = False
                    samples = await scrape(http, fairq.metrics_url)
                served = total(samples, "fairq_requests_total")
                rss = fairq.rss_bytes()
                round_result = RoundResult(
                    index,
                    fault,
                    victim.name if fault != "none" else "-",
                    tally.codes,
                    len(tally.violations),
                    n,
                    tally.reached_server,
                    served - before,
                    tally.unavailable,
                    tally.repeated_started,
                    rss,
                    prober.stats(started, time.monotonic()),
                    tally.examples,
                    tally.deadline_races,
                    tuple(tally.violations[:3]),
                )
                before = served
                result.rounds.append(round_result)
                log(
                    f"soak round {index} ({fault} on {round_result.victim}): {n} requests, "
                    f"{dict(tally.codes)}, RSS {rss / 2**20:.1f} MiB, "
                    f"probe max {round_result.probe.max * 1000:.0f} ms"
                )
            if size.churn_users:
                result.churn_users = size.churn_users
                result.churn_rss_known, result.churn_rss_delta = await _churn(
                    http, fairq, chans, size.churn_users
                )
                log(
                    f"soak: {result.churn_users} one-request users: RSS "
                    f"{result.churn_rss_delta / 2**20:+.1f} MiB"
                )
    finally:
        for chan in chans:
            await chan.close()
        await prober.stop()
        await fairq.stop()
        for backend in backends:
            await backend.stop()
    return result


async def _churn(
    http: httpx.AsyncClient, fairq: ChildProcess, chans: Sequence[grpc.aio.Channel], users: int
) -> tuple[int, int]:
    """RSS growth of a quiet fairq over a batch of ``users`` requests from 8 known users, and
    over a batch of as many requests each from a user never seen before.

    The first batch runs twice and the second run is the one reported: any batch of this
    size grows the allocator's pools once. State kept per user after its last request would
    show as the difference between the two figures.
    """
    tally = Tally()
    admission = asyncio.Semaphore(ADMISSION_WINDOW)

    async def batch(user: Callable[[int], str]) -> int:
        await fairq_quiet(http, fairq)
        before = fairq.rss_bytes()
        await asyncio.gather(
            *(
                send(chans[i % len(chans)], Spec(user(i), 1), tally, prompt_for(user(i), i),
                     admission)
                for i in range(users)
            )
        )  # fmt: skip
        await fairq_quiet(http, fairq)
        return fairq.rss_bytes() - before

    await batch(lambda i: f"known-{i % 8}")
    known = await batch(lambda i: f"known-{i % 8}")
    return known, await batch(lambda i: f"churn-{i}")


async def _delayed(seconds: float, coro: Coroutine[None, None, None]) -> None:
    await asyncio.sleep(seconds)  # the fault's place in the round's schedule
    await coro


# -- report and command line ---------------------------------------------------------------------


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value * 1000:.0f} ms"


def _examples(examples: dict[str, str]) -> str:
    return "; ".join(f"{code}: {text[:160]}" for code, text in sorted(examples.items())) or "-"


def _probe(p: ProbeStats) -> str:
    return f"{_ms(p.p50)} / {_ms(p.p99)} / {_ms(p.max)}"


def capacity_table(r: CapacityResult) -> str:
    """The capacity figures as a markdown table."""
    probe = r.probe or ProbeStats()
    fill = r.probe_queue_fill or probe
    codes = ", ".join(f"{k} {v}" for k, v in sorted(r.tally.codes.items()))
    rows: list[Sequence[object]] = [
        ("running streams (fairq in flight, peak)", f"{r.peak_in_flight:.0f}"),
        ("running on the backend (sim, peak)", f"{r.peak_backend_running:.0f}"),
        ("queued in fairq (peak depth)", f"{r.peak_queue_depth:.0f}"),
        ("users", r.size.users),
        ("time to start all streams", f"{r.stream_start_seconds:.1f} s"),
        ("time to queue all requests", f"{r.queue_fill_seconds:.1f} s"),
        (
            "fairq RSS idle / with streams / with queue",
            f"{r.rss_idle / 2**20:.0f} / {r.rss_streams / 2**20:.0f} / "
            f"{r.rss_queued / 2**20:.0f} MiB",
        ),
        ("fairq RSS per running stream", f"{r.bytes_per_stream / 1024:.1f} KiB"),
        ("fairq RSS per queued request", f"{r.bytes_per_queued / 1024:.1f} KiB"),
        ("fairq health probe p50 / p99 / max, whole run", _probe(probe)),
        ("  the same while the queue fills", _probe(fill)),
        (
            "  idle control server at the same instants, p99 / max",
            f"{_ms(probe.control_p99)} / {_ms(probe.control_max)}",
        ),
        (
            "  fairq minus control, p99 / max (stall bound)",
            f"{_ms(probe.excess_p99)} / {_ms(probe.excess_max)}",
        ),
        ("health probes (failed)", f"{probe.count} ({probe.failures})"),
        (
            "  slowest probes (s into the run: latency)",
            ", ".join(f"{at:.0f} s: {_ms(lat)}" for at, lat in probe.worst) or "-",
        ),
        ("  streams ended, first wave of queued work started at", f"{r.first_wave_seconds:.0f} s"),
        (
            "fairq CPU (avg cores)",
            f"{r.fairq_cpu_seconds:.0f} s ({r.fairq_cpu_seconds / max(r.total_seconds, 1e-9):.2f})",
        ),
        ("requests: outcomes", codes),
        ("  first message per error status", _examples(r.tally.examples)),
        ("requests without exactly one terminal event", len(r.tally.violations)),
        ("  e.g.", "; ".join(str(v) for v in r.tally.violations[:2]) or "-"),
        ("requests counted by fairq's fairq_requests_total", f"{r.server_outcomes:.0f}"),
        ("queue and in-flight back to 0 after", "yes" if r.quiet_after else "NO"),
        ("wall time", f"{r.total_seconds:.0f} s"),
    ]
    return markdown_table(("capacity", "value"), rows)


def soak_table(r: SoakResult) -> str:
    """The soak rounds as a markdown table."""
    rows: list[Sequence[object]] = []
    for x in r.rounds:
        codes = ", ".join(f"{k} {v}" for k, v in sorted(x.codes.items()))
        rows.append(
            (
                f"{x.index}: {x.fault} ({x.victim})",
                f"{x.sent} / {x.reached_server} / {x.server_outcomes:.0f}",
                codes,
                " / ".join(str(x.unavailable[k]) for k in ("queued", "before text", "mid-stream")),
                x.repeated_started,
                x.violations,
                f"{x.rss / 2**20:.1f}",
                f"{_ms(x.probe.max)} ({_ms(x.probe.excess_max)})",
            )
        )
    header = (
        "round: fault (backend)",
        "sent / reached fairq / fairq counted",
        "client outcomes",
        "UNAVAILABLE: while queued / before text / mid-stream",
        "retried (2nd started)",
        "not one terminal event",
        "fairq RSS MiB (quiet)",
        "probe max (minus control)",
    )
    lines = [
        markdown_table(header, rows),
        "",
        f"RSS growth first -> last round: {r.rss_growth / 2**20:+.1f} MiB; "
        f"queue and in-flight back to 0 after every round: "
        f"{'yes' if r.quiet_every_round else 'NO'}",
        "",
        *(f"- round {x.index}, first messages: {_examples(x.examples)}" for x in r.rounds),
        f"- finished, then the client's own deadline (see Outcome.deadline_race): "
        f"{sum(x.deadline_races for x in r.rounds)}",
        *(
            f"- round {x.index}, not one terminal event: {v}"
            for x in r.rounds
            for v in x.violation_examples
        ),
    ]
    if r.churn_users:
        lines.append(
            f"User churn: {r.churn_users} requests grew fairq's quiet RSS by "
            f"{r.churn_rss_known / 2**20:+.1f} MiB from 8 known users and by "
            f"{r.churn_rss_delta / 2**20:+.1f} MiB from as many new users "
            f"({(r.churn_rss_delta - r.churn_rss_known) / r.churn_users:+.0f} bytes per new user)"
        )
    return "\n".join(lines)


async def run(size: LoadSize, *, do_capacity: bool = True, do_soak: bool = True) -> bool:
    """Run the phases, print their tables; return whether every check held."""
    ok = True
    if do_capacity:
        cap = await capacity(size)
        print(capacity_table(cap), flush=True)
        ok &= not cap.tally.violations and cap.tally.codes == Counter(
            {"OK": size.streams + size.queued}
        )
        ok &= cap.peak_in_flight == size.streams and cap.quiet_after
    if do_soak:
        result = await soak(size)
        print(soak_table(result), flush=True)
        ok &= result.quiet_every_round
        ok &= all(x.violations == 0 and x.counted_ok for x in result.rounds)
    return ok


def main(argv: list[str] | None = None) -> int:
    """``python -m fairq_server.bench.load [--quick]``: exit 1 if a check failed."""
    parser = argparse.ArgumentParser(
        prog="python -m fairq_server.bench.load", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a minute or two)")
    parser.add_argument("--streams", type=int)
    parser.add_argument("--queued", type=int)
    parser.add_argument("--users", type=int)
    parser.add_argument("--soak-seconds", type=float)
    parser.add_argument("--speed", type=float, help="simulator clock factor")
    parser.add_argument("--no-capacity", action="store_true")
    parser.add_argument("--no-soak", action="store_true")
    parser.add_argument("--probe", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--probe-control", help=argparse.SUPPRESS)
    parser.add_argument("--probe-interval", type=float, default=0.02, help=argparse.SUPPRESS)
    parser.add_argument("--control-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe or args.control_server:
        # Helper processes of a run: they serve until the run sends SIGTERM.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            if args.control_server:
                asyncio.run(control_server())
            else:
                asyncio.run(probe_forever(args.probe, args.probe_control, args.probe_interval))
        return 0
    size = QUICK if args.quick else FULL
    overrides = {
        k: getattr(args, k)
        for k in ("streams", "queued", "users", "soak_seconds", "speed")
        if getattr(args, k) is not None
    }
    size = replace(size, **overrides)

    async def interruptible() -> bool:
        # SIGTERM (e.g. from `timeout`) cancels the run, so every child process is stopped.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run(size, do_capacity=not args.no_capacity, do_soak=not args.no_soak)

    try:
        ok = asyncio.run(interruptible())
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("load: interrupted", file=sys.stderr)
        return 1
    print("load: all checks held" if ok else "load: A CHECK FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
