"""What a hostile backend costs fairq: resident memory and CPU, measured from outside.

Run ``python -m fairq_bench.hostile [metrics|error|registrations ...]``. fairq runs as
a ``fairq serve`` child, the misbehaving backend as another
(:mod:`fairq_bench.hostile_backend`); this process only drives them and reads
``/proc/<pid>`` of fairq. With ``--baseline DIR`` every scenario runs a second time against
the fairq package under ``DIR`` (another checkout's ``server/`` directory), side by side::

    git archive <commit> server clients | tar -x -C /tmp/base
    python -m fairq_bench.hostile --baseline /tmp/base/server

Scenarios (the sizes of the report that prompted them):

``metrics``
    one registered backend whose ``/metrics`` never ends, polled every 0.5 s for
    ``--seconds``; then it is deregistered and fairq's memory read again.
``error``
    one request to a backend answering HTTP 500 with a body that never ends.
``registrations``
    ``--backends`` (1,500) registrations of a URL nobody listens on, each for a model of its
    own, beside one healthy simulated backend: registration and deregistration rates, fairq's
    CPU in between, and the latency of a normal request.
``calls``
    fairq's CPU per health ``Check`` and per short ``Generate`` (no hostile party): the cost
    of reading and decoding requests in fairq's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fairq.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.load.children import ChildProcess, free_port, start_child, start_fairq

__all__ = ["Figures", "main"]

MiB = 1024 * 1024
_SAMPLE_SECONDS = 0.1


@dataclass
class Figures:
    """What one scenario measured on one fairq build (missing figures stay None)."""

    rss_start_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_after_mib: float | None = None
    cpu_percent: float = 0.0
    notes: dict[str, str] = field(default_factory=dict)


class Sampler:
    """Samples a child's RSS every 100 ms and its CPU over a window."""

    def __init__(self, child: ChildProcess) -> None:
        self.child = child
        self.peak = child.rss_bytes()
        self._task: asyncio.Task[None] | None = None
        self._cpu0 = self._wall0 = 0.0

    def start(self) -> None:
        self._cpu0, self._wall0 = self.child.cpu_seconds(), time.monotonic()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self.child.proc.returncode is None:
            self.peak = max(self.peak, self.child.rss_bytes())
            await asyncio.sleep(_SAMPLE_SECONDS)

    async def stop(self) -> float:
        """Stop sampling; return the CPU used over the window, in % of one core."""
        cpu = 100 * (self.child.cpu_seconds() - self._cpu0) / (time.monotonic() - self._wall0)
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.peak = max(self.peak, self.child.rss_bytes())
        return cpu


@contextlib.asynccontextmanager
async def _child(start: Awaitable[ChildProcess]) -> AsyncIterator[ChildProcess]:
    child = await start
    try:
        yield child
    finally:
        await child.stop()


def _hostile(metrics: str = "idle", generate: str = "ok") -> Awaitable[ChildProcess]:
    return start_child(
        ["--metrics", metrics, "--generate", generate],
        r"^(http://\S+)",
        module="fairq_bench.hostile_backend",
    )


def _backend(backend_id: str, url: str, model: str) -> admin_pb2.RegisterBackendRequest:
    return admin_pb2.RegisterBackendRequest(
        backend=admin_pb2.Backend(
            id=backend_id, kind=admin_pb2.BACKEND_KIND_VLLM, base_url=url, models=[model]
        )
    )


async def metrics_scenario(env: Mapping[str, str], extra: str, seconds: float) -> Figures:
    """A /metrics body that never ends, scraped for ``seconds``, then deregistered."""
    async with (
        _child(_hostile(metrics="endless")) as hostile,
        _child(start_fairq('listen = "127.0.0.1:0"\n' + extra, env=env)) as fairq,
        grpc.aio.insecure_channel(fairq.address) as ch,
    ):
        admin = admin_pb2_grpc.AdminStub(ch)
        figures = Figures(rss_start_mib=fairq.rss_bytes() / MiB)
        sampler = Sampler(fairq)
        sampler.start()
        try:
            await admin.RegisterBackend(_backend("endless", hostile.address, "m"), timeout=60)
        except grpc.aio.AioRpcError as exc:
            figures.notes["register"] = exc.code().name
        await asyncio.sleep(seconds)  # the measurement window
        figures.cpu_percent = await sampler.stop()
        figures.rss_peak_mib = sampler.peak / MiB
        await admin.DeregisterBackend(admin_pb2.DeregisterBackendRequest(id="endless"), timeout=60)
        await asyncio.sleep(3)  # let what was in flight finish before reading memory again
        figures.rss_after_mib = fairq.rss_bytes() / MiB
    return figures


async def error_scenario(env: Mapping[str, str], extra: str, seconds: float) -> Figures:
    """One request answered HTTP 500 with a body that never ends."""
    async with _child(_hostile(generate="error-endless")) as hostile:
        config = (
            'listen = "127.0.0.1:0"\n'
            f'[[backends]]\nid = "bad"\nkind = "vllm"\nbase_url = "{hostile.address}"\n'
            f'models = ["m"]\n{extra}'
        )
        async with (
            _child(start_fairq(config, env=env)) as fairq,
            grpc.aio.insecure_channel(fairq.address) as ch,
        ):
            figures = Figures(rss_start_mib=fairq.rss_bytes() / MiB)
            sampler = Sampler(fairq)
            sampler.start()
            request = scheduler_pb2.GenerateRequest(model="m", prompt="hi")
            started = time.monotonic()
            call = scheduler_pb2_grpc.SchedulerStub(ch).Generate(request, timeout=seconds)
            try:
                async for _ in call:
                    pass
                figures.notes["status"] = "OK"
            except grpc.aio.AioRpcError as exc:
                figures.notes["status"] = exc.code().name
            figures.notes["answered after"] = f"{time.monotonic() - started:.2f} s"
            figures.cpu_percent = await sampler.stop()
            figures.rss_peak_mib = sampler.peak / MiB
            await asyncio.sleep(3)
            figures.rss_after_mib = fairq.rss_bytes() / MiB
    return figures


async def _rate(
    ids: list[str], call: Callable[[str], Awaitable[object]], budget: float, concurrency: int = 8
) -> tuple[int, int, float]:
    """Run ``call`` for each id, ``concurrency`` at a time, within ``budget`` seconds.

    Returns (succeeded, refused, seconds).
    """
    todo = iter(ids)
    ok = refused = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal ok, refused
        for item in todo:
            if time.monotonic() - started > budget:
                return
            try:
                await call(item)
                ok += 1
            except grpc.aio.AioRpcError:
                refused += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, refused, time.monotonic() - started


async def _latencies(ch: grpc.aio.Channel, n: int, timeout: float = 20.0) -> list[float]:
    """Seconds each of ``n`` short requests took; one that failed counts as ``inf``."""
    stub = scheduler_pb2_grpc.SchedulerStub(ch)
    request = scheduler_pb2.GenerateRequest(
        model="sim", prompt="hi", sampling=scheduler_pb2.SamplingParams(max_tokens=4)
    )
    out = []
    for _ in range(n):
        started = time.monotonic()
        try:
            async for _ in stub.Generate(request, timeout=timeout):
                pass
        except grpc.aio.AioRpcError:
            out.append(float("inf"))
            continue
        out.append(time.monotonic() - started)
    return out


def _ms(seconds: float) -> str:
    return "failed" if seconds == float("inf") else f"{seconds * 1000:.0f}"


async def registrations_scenario(
    env: Mapping[str, str], extra: str, backends: int, budget: float
) -> Figures:
    """``backends`` registrations of a dead URL beside a healthy backend."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections refused
    sim = start_child(["sim", "--port", "0", "--speed", "20"], r"^(http://\S+)")
    async with _child(sim) as good:
        config = (
            'listen = "127.0.0.1:0"\n'
            f'[[backends]]\nid = "good"\nkind = "vllm"\nbase_url = "{good.address}"\n'
            f'models = ["sim"]\n{extra}'
        )
        async with (
            _child(start_fairq(config, env=env)) as fairq,
            grpc.aio.insecure_channel(fairq.address) as ch,
        ):
            admin = admin_pb2_grpc.AdminStub(ch)
            figures = Figures(rss_start_mib=fairq.rss_bytes() / MiB)
            idle = await _latencies(ch, 10)
            sampler = Sampler(fairq)
            sampler.start()
            ids = [f"dead-{i}" for i in range(backends)]
            ok, refused, took = await _rate(
                ids,
                lambda i: admin.RegisterBackend(_backend(i, dead, f"m-{i}"), timeout=60),
                budget,
            )
            await sampler.stop()
            figures.notes["registered"] = f"{ok} ({refused} refused) in {took:.1f} s"
            figures.notes["registrations/s"] = f"{(ok + refused) / took:.1f}"
            await asyncio.sleep(5)  # settle: every poller has failed a few times
            sampler = Sampler(fairq)
            sampler.start()
            loaded = await _latencies(ch, 5)
            listed = await admin.ListBackends(admin_pb2.ListBackendsRequest(), timeout=60)
            await asyncio.sleep(max(0.0, 10 - sum(x for x in loaded if x != float("inf"))))
            figures.cpu_percent = await sampler.stop()
            figures.rss_peak_mib = sampler.peak / MiB
            good_healthy = [b.healthy for b in listed.backends if b.backend.id == "good"]
            figures.notes["good backend healthy"] = str(good_healthy == [True])
            figures.notes["request p50 idle / loaded (ms)"] = (
                f"{_ms(statistics.median(idle))} / {_ms(statistics.median(loaded))}"
            )
            figures.notes["request max loaded (ms)"] = _ms(max(loaded))
            figures.notes["requests failed (of 5, 20 s deadline)"] = str(
                sum(x == float("inf") for x in loaded)
            )
            gone, _, took = await _rate(
                ids[:ok],
                lambda i: admin.DeregisterBackend(
                    admin_pb2.DeregisterBackendRequest(id=i), timeout=60
                ),
                budget,
            )
            figures.notes["deregistrations/s"] = f"{gone / took:.1f}" if gone else "-"
            await asyncio.sleep(3)
            figures.rss_after_mib = fairq.rss_bytes() / MiB
    return figures


async def calls_scenario(env: Mapping[str, str], extra: str, calls: int) -> Figures:
    """fairq's CPU per unary call (health Check) and per Generate: what reading and decoding
    requests in fairq's own code (``api/receive.py``) costs against gRPC's own path."""
    sim = start_child(["sim", "--port", "0", "--speed", "50"], r"^(http://\S+)")
    async with _child(sim) as good:
        config = (
            'listen = "127.0.0.1:0"\n'
            f'[[backends]]\nid = "good"\nkind = "vllm"\nbase_url = "{good.address}"\n'
            f'models = ["sim"]\n{extra}'
        )
        async with (
            _child(start_fairq(config, env=env)) as fairq,
            grpc.aio.insecure_channel(fairq.address) as ch,
        ):
            figures = Figures(rss_start_mib=fairq.rss_bytes() / MiB)
            health = health_pb2_grpc.HealthStub(ch)
            await _latencies(ch, 5)  # warm up
            cpu0, wall0 = fairq.cpu_seconds(), time.monotonic()
            ok, _, _ = await _rate(
                [""] * calls,
                lambda _: health.Check(health_pb2.HealthCheckRequest(), timeout=30),
                budget=600,
                concurrency=16,
            )
            cpu1, wall1 = fairq.cpu_seconds(), time.monotonic()
            figures.notes["health Check: fairq CPU per call"] = f"{(cpu1 - cpu0) / ok * 1e6:.0f} us"
            figures.notes["health Check: calls/s"] = f"{ok / (wall1 - wall0):.0f}"
            n = calls // 10
            cpu0 = fairq.cpu_seconds()
            await asyncio.gather(*(_latencies(ch, n // 8) for _ in range(8)))
            per = (fairq.cpu_seconds() - cpu0) / (n // 8 * 8)
            figures.notes["Generate (4 tokens): fairq CPU per call"] = f"{per * 1e6:.0f} us"
            figures.rss_peak_mib = figures.rss_after_mib = fairq.rss_bytes() / MiB
    return figures


def _table(title: str, runs: dict[str, Figures]) -> str:
    names = list(runs)
    rows = [
        ("fairq RSS at start (MiB)", [f"{r.rss_start_mib:.0f}" for r in runs.values()]),
        ("fairq RSS peak (MiB)", [f"{r.rss_peak_mib:.0f}" for r in runs.values()]),
        ("fairq RSS after (MiB)", [f"{r.rss_after_mib or 0:.0f}" for r in runs.values()]),
        ("fairq CPU (% of a core)", [f"{r.cpu_percent:.0f}" for r in runs.values()]),
    ]
    for key in dict.fromkeys(k for r in runs.values() for k in r.notes):
        rows.append((key, [r.notes.get(key, "-") for r in runs.values()]))
    lines = [f"### {title}", "", "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> None:
    """Run the chosen scenarios on this build (and the baseline), print one table each."""
    builds: dict[str, tuple[dict[str, str], str]] = {}
    if args.baseline:
        builds["baseline"] = ({"PYTHONPATH": args.baseline}, "")
    builds["this build"] = ({}, "[admin]\nmax_backends = 2000\n")
    if "registrations" in args.scenarios:
        builds["this build, default cap"] = ({}, "")
    for scenario in args.scenarios:
        runs: dict[str, Figures] = {}
        for name, (env, extra) in builds.items():
            if scenario == "metrics" and name != "this build, default cap":
                runs[name] = await metrics_scenario(env, extra, args.seconds)
            elif scenario == "error" and name != "this build, default cap":
                runs[name] = await error_scenario(env, extra, args.seconds)
            elif scenario == "registrations":
                runs[name] = await registrations_scenario(env, extra, args.backends, args.budget)
            elif scenario == "calls" and name != "this build, default cap":
                runs[name] = await calls_scenario(env, extra, args.calls)
        print(_table(scenario, runs), flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m fairq_bench.hostile``: print a table per scenario."""
    parser = argparse.ArgumentParser(
        prog="python -m fairq_bench.hostile", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "scenarios", nargs="*", default=["metrics", "error", "registrations", "calls"],
        choices=["metrics", "error", "registrations", "calls"],
    )  # fmt: skip
    parser.add_argument("--calls", type=int, default=4000, help="health checks (calls scenario)")
    parser.add_argument("--baseline", metavar="DIR", help="another checkout's server/ directory")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window")
    parser.add_argument("--backends", type=int, default=1500)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per (de)registration")
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
