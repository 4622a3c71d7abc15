"""``python -m fairq_bench.hot_path.ab --before REF``: this checkout against another, side by side.

On a shared machine two runs minutes apart differ by more than most changes to the relay, so
a before/after figure must come from one run: both versions of fairq run at once, pinned to
the same core (only the one being measured is loaded), and the rounds alternate between them
(and between the doors) after a warm-up, so a burst of load from elsewhere hits both. The
"before" version is ``git archive REF server`` unpacked in a temporary directory and put first
on the child's ``PYTHONPATH``; everything else (the load, the backend) is this checkout's.

Printed per door and version: the median over rounds of tokens per fairq core-second and of
tokens/s relayed, the added time to first token at low load (p50 and p99 over the probes,
minus those of straight to the backend), and the coalescing stretch at the end of each
measured window (``fairq_stream_coalesce_stretch``; NaN for a version without it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from fairq_bench.hot_path.load import (
    Probe,
    Rate,
    background,
    door_probes,
    door_streams,
    http_probe,
    measure,
)
from fairq_bench.hot_path.scenario import _flames
from fairq_bench.hot_path.setup import HTTP_LIMITS, TIERS, Door, Stack, paced_backend, pinned
from fairq_bench.processes import fairq_module_process, toml_config
from fairq_bench.report import percentile
from fairq_bench.targets import free_port

__all__ = ["main"]

STREAM_TOKENS = 200


@contextlib.contextmanager
def _checkout(ref: str) -> Iterator[Path]:
    """``server/`` of ``ref`` unpacked in a temporary directory; yields the ``server`` path."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", ref, "server"], check=True, capture_output=True
        ).stdout
        tar_path = Path(tmp) / "server.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp) / "server"


@contextlib.contextmanager
def _pythonpath(path: Path | None) -> Iterator[None]:
    """Children started inside import fairq_server from ``path`` (None: this checkout)."""
    old = os.environ.get("PYTHONPATH")
    if path is not None:
        os.environ["PYTHONPATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


_STRETCH = re.compile(rb"^fairq_stream_coalesce_stretch (\S+)$", re.MULTILINE)
_METRICS: dict[int, str] = {}  # pid -> its metrics endpoint


async def _stretch(session: object, door: Door) -> float:
    """The door's coalescing stretch now (NaN for a version that has none)."""
    import aiohttp

    assert isinstance(session, aiohttp.ClientSession)
    async with session.get(_METRICS[door.pid]) as resp:
        found = _STRETCH.search(await resp.read())
    return float(found.group(1)) if found else float("nan")


async def _door(
    stack: contextlib.AsyncExitStack, backend: str, cpus: set[int], source: Path | None
) -> Door:
    import grpc

    http, metrics = free_port(), free_port()
    text = toml_config(
        backend, "sim", "vllm",
        f'metrics_listen = "127.0.0.1:{metrics}"\n'
        f'[http]\nlisten = "127.0.0.1:{http}"\n{HTTP_LIMITS}{TIERS}',
    )  # fmt: skip
    with pinned(cpus), _pythonpath(source):
        proc, target = await stack.enter_async_context(fairq_module_process(text))
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
    await channel.channel_ready()
    _METRICS[proc.pid] = f"http://127.0.0.1:{metrics}/metrics"
    return Door(proc.pid, target, f"http://127.0.0.1:{http}", channel)


@contextlib.asynccontextmanager
async def _stack(source: Path) -> AsyncIterator[tuple[str, object, dict[str, Door]]]:
    async with contextlib.AsyncExitStack() as stack:
        where, backend, session = await paced_backend(stack)
        doors = {
            "before": await _door(stack, backend, where.fairq, source),
            "after": await _door(stack, backend, where.fairq, None),
        }
        yield backend, session, doors


async def _run(args: argparse.Namespace) -> None:
    with _checkout(args.before) as source:
        async with _stack(source) as (backend, session, doors):
            import aiohttp

            assert isinstance(session, aiohttp.ClientSession)
            versions = list(doors)
            # Warm-up: every door of both versions carries load once (first imports, pools).
            for version in versions:
                for send in door_streams(session, doors[version]).values():
                    async with background(send, args.streams, STREAM_TOKENS):
                        await asyncio.sleep(args.warmup)
            idle = {}
            for version in versions:  # what each costs with no load (scrapes, timers, polls)
                idle[version] = (
                    await measure(session, backend, [doors[version].pid], args.seconds)
                ).fairq_cores
            print(f"  idle cores: {idle}", flush=True)
            rates: dict[tuple[str, str], list[Rate]] = {}
            stretches: dict[tuple[str, str], list[float]] = {}
            for r in range(args.rounds):
                order = versions if r % 2 == 0 else versions[::-1]
                for door in ("grpc", "http") if r % 2 == 0 else ("http", "grpc"):
                    for version in order:
                        send = door_streams(session, doors[version])[door]
                        async with background(send, args.streams, STREAM_TOKENS):
                            await asyncio.sleep(1.0)
                            rate = await measure(
                                session, backend, [doors[version].pid], args.seconds
                            )
                            stretch = await _stretch(session, doors[version])
                        rates.setdefault((door, version), []).append(rate)
                        stretches.setdefault((door, version), []).append(stretch)
                        print(f"  round {r} {door} {version}: {rate.per_core_second:,.0f} "
                              f"tokens per core-second ({rate.tokens_per_second:,.0f}/s, "
                              f"{rate.fairq_cores:.2f} cores, stretch {stretch:.2f})",
                              flush=True)  # fmt: skip
            low = await _low_load(session, backend, doors, args.probes)
            loaded = {}
            if args.loaded:
                loaded = await _under_load(session, backend, doors, args.loaded, args.probes)
            if args.flame:
                stack = Stack(backend, session, doors["after"])
                await _flames(stack, Path(args.flame), args.streams, 8)
    print(f"\n{'door':6} {'version':7} {'tok/core-s':>11} {'tok/s':>8} {'cores':>6} "
          f"{'us/token':>9} {'+p50 ms':>8} {'+p99 ms':>8} {'stretch':>8}")  # fmt: skip
    for door in ("grpc", "http"):
        for version in versions:
            got = rates[(door, version)]
            p50, p99 = low[(door, version)]
            # CPU per token above the process's idle cost: what relaying adds per token.
            marginal = statistics.median(
                (x.fairq_cores - idle[version]) / x.tokens_per_second * 1e6 for x in got
            )
            print(f"{door:6} {version:7} "
                  f"{statistics.median(x.per_core_second for x in got):11,.0f} "
                  f"{statistics.median(x.tokens_per_second for x in got):8,.0f} "
                  f"{statistics.median(x.fairq_cores for x in got):6.3f} {marginal:9.1f} "
                  f"{p50 * 1000:8.2f} {p99 * 1000:8.2f} "
                  f"{statistics.median(stretches[(door, version)]):8.2f}")  # fmt: skip
    if loaded:
        print(f"\nunder {args.loaded} streams of the same door: added TTFT (ms)")
        print(f"{'door':6} {'version':7} {'+p50':>8} {'+p90':>8} {'+p99':>8}")
        for (door, version), added in loaded.items():
            print(f"{door:6} {version:7} " + " ".join(f"{a * 1000:8.2f}" for a in added))


async def _low_load(
    session: object, backend: str, doors: dict[str, Door], probes: int
) -> dict[tuple[str, str], tuple[float, float]]:
    """Added p50/p99 per (door, version): one probe at a time, the paths' order rotating."""
    import aiohttp

    assert isinstance(session, aiohttp.ClientSession)
    paths: dict[tuple[str, str], Probe] = {("direct", ""): http_probe(session, backend)}
    for version, door in doors.items():
        for door_name, probe in door_probes(session, door).items():
            paths[(door_name, version)] = probe
    names = list(paths)
    for path in names * 3:
        await paths[path](0)
    samples: dict[tuple[str, str], list[float]] = {n: [] for n in names}
    for i in range(probes):
        k = i % len(names)
        for path in names[k:] + names[:k]:
            samples[path].append(await paths[path](i))
            await asyncio.sleep(0.002)
    base50 = percentile(samples[("direct", "")], 50)
    base99 = percentile(samples[("direct", "")], 99)
    return {
        n: (percentile(v, 50) - base50, percentile(v, 99) - base99)
        for n, v in samples.items()
        if n[0] != "direct"
    }


async def _under_load(
    session: object, backend: str, doors: dict[str, Door], streams: int, probes: int
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Added p50/p90/p99 per (door, version) with ``streams`` of that door's load running.

    Each (door, version) gets its load in turn, twice (the second pass in the other order),
    and its probes alternate with probes straight to the backend, which shares the load.
    """
    import aiohttp

    assert isinstance(session, aiohttp.ClientSession)
    direct = http_probe(session, backend)
    runs = [(door, version) for door in ("grpc", "http") for version in doors]
    got: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    base: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    for run in runs + runs[::-1]:
        door, version = run
        probe = door_probes(session, doors[version])[door]
        async with background(door_streams(session, doors[version])[door], streams, 200):
            await asyncio.sleep(1.5)
            for i in range(probes // 2):
                got[run].append(await probe(i))
                base[run].append(await direct(i))
                await asyncio.sleep(0.005)
        print(f"  loaded {door} {version}: p99 {percentile(got[run], 99) * 1000:.1f} ms",
              flush=True)  # fmt: skip

    def added(run: tuple[str, str], q: float) -> float:
        return percentile(got[run], q) - percentile(base[run], q)

    return {run: (added(run, 50), added(run, 90), added(run, 99)) for run in runs}


def main(argv: list[str] | None = None) -> None:
    """Compare this checkout's hot path with ``--before``'s, interleaved in one run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git ref of the 'before' version")
    parser.add_argument("--rounds", type=int, default=5)
    # Few enough that the load generator (on the backend's core) keeps up: both versions then
    # relay the same tokens per second, and their CPU compares directly.
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--flame", default="", help="directory for py-spy flame graphs (after)")
    parser.add_argument(
        "--loaded", type=int, default=0,
        help="also the added TTFT with this many streams of load on the door (0: not measured)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    asyncio.run(_run(args))


if __name__ == "__main__":
    main(sys.argv[1:])
