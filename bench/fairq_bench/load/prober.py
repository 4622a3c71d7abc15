"""The event-loop prober, a process of its own: it times fairq's gRPC health ``Check`` next
to an idle control server's, and the load generator reads its samples by window."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fairq_bench.load.children import ChildProcess, start_child
from fairq_bench.report import percentile

__all__ = ["ProbeStats", "Prober", "control_server", "probe_forever"]


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
        control = await start_child(["--control-server"], r"port (\d+)", module="fairq_bench.load")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fairq_bench.load", "--probe", target,
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
