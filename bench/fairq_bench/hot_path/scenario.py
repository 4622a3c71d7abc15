"""``fairq bench hot-path``: what fairq costs per token and adds to a first token.

A zero-cost backend (the firehose, first token at once, then a token per stream every 10 ms
like an engine's steps), fairq pinned to one core and the backend and load on the other
(:mod:`.setup`). Three measurements, each in interleaved rounds (the doors and paths take
turns, so a burst of load from elsewhere on the machine hits all of them) and reported as the
median over rounds:

- tokens per fairq core-second through each door, several hundred engine-paced streams;
- added time to first token at low load (one request at a time), each door against straight
  to the backend, and a replica of three on Redis against one process alone;
- the added p99 with each door loaded to about 80 % of the core it was measured to fill.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from fairq_bench.hot_path.load import (
    Rate,
    Rounds,
    background,
    door_probes,
    door_streams,
    http_probe,
    latency_rounds,
    measure,
)
from fairq_bench.hot_path.page import Figures, write_page
from fairq_bench.hot_path.setup import Stack, hot_stack

__all__ = ["hot_path"]

STREAM_TOKENS = 200
PER_STREAM = 100.0  # tokens per second a stream gets from a 10 ms engine step
MAX_STREAMS = 1200


def _added(rounds: Rounds, path: str, base: str, q: int) -> float:
    """Median over rounds of ``path``'s percentile minus ``base``'s (index 0: p50, 1: p99)."""
    return statistics.median(a[q] - b[q] for a, b in zip(rounds[path], rounds[base], strict=True))


async def _throughput(st: Stack, rounds: int, streams: int, seconds: float) -> dict[str, Rate]:
    """Per door, the round with the median tokens per core-second."""
    sends = door_streams(st.session, st.alone)
    names = list(sends)
    got: dict[str, list[Rate]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            async with background(sends[name], streams, STREAM_TOKENS):
                await asyncio.sleep(1.0)  # ramp-up: every stream open
                got[name].append(await measure(st.session, st.backend, [st.alone.pid], seconds))
    return {
        n: sorted(rates, key=lambda x: x.per_core_second)[len(rates) // 2]
        for n, rates in got.items()
    }


async def _loaded(
    st: Stack, capacity: Mapping[str, float], probes: int
) -> dict[str, tuple[float, float, int]]:
    """Per door at ~80 % of its capacity: (added p99 s, fairq cores, streams).

    Capacity is the tokens per second the door relayed under the throughput load: what the
    process could do with the share of its core it was given (on a shared machine, less than
    the core), not tokens per core-second.
    """
    sends = door_streams(st.session, st.alone)
    doors = door_probes(st.session, st.alone)
    direct = http_probe(st.session, st.backend)
    out = {}
    for name, send in sends.items():
        streams = min(MAX_STREAMS, max(1, int(0.8 * capacity[name] / PER_STREAM)))
        async with background(send, streams, STREAM_TOKENS):
            await asyncio.sleep(1.5)
            window = asyncio.create_task(measure(st.session, st.backend, [st.alone.pid], 1.0))
            got = await latency_rounds({"direct": direct, name: doors[name]}, 1, probes)
            rate = await window
        out[name] = (_added(got, name, "direct", 1), rate.fairq_cores, streams)
    return out


async def _flames(st: Stack, out: Path, streams: int, seconds: float) -> list[Path]:
    """py-spy flame graphs of the lone fairq process under load through each door."""
    spy = shutil.which("py-spy")
    command = [spy] if spy else ["uv", "tool", "run", "py-spy"]
    written = []
    for name, send in door_streams(st.session, st.alone).items():
        path = out / f"hot-path-{name}.svg"
        async with background(send, streams, STREAM_TOKENS):
            await asyncio.sleep(1.0)
            proc = await asyncio.create_subprocess_exec(
                *command, "record", "--pid", str(st.alone.pid), "--duration", str(int(seconds)),
                "--rate", "250", "--nonblocking", "--output", str(path),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await proc.communicate()
        if proc.returncode != 0:
            print(f"  py-spy failed: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
        else:
            written.append(path)
    return written


async def hot_path(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run the hot-path benchmark; True if nothing collapsed (generous bounds)."""
    del url  # runs its own zero-cost backend
    quick = args.quick
    # Quick: one replica on Redis, not three (starting each costs seconds on a busy machine;
    # a collapse of the shared path shows with one).
    rounds, per_round, replicas = (1, 20, 1) if quick else (5, 100, 3)
    t_rounds, streams, seconds = (1, 150, 1.5) if quick else (3, 400, 5.0)
    load_before, started = os.getloadavg()[0], time.monotonic()
    async with hot_stack(replicas) as st:
        alone, replica = door_probes(st.session, st.alone), door_probes(st.session, st.replicas[0])
        paths = {
            "direct": http_probe(st.session, st.backend),
            "grpc": alone["grpc"],
            "http": alone["http"],
            "replica grpc": replica["grpc"],
            "replica http": replica["http"],
        }
        print(f"  started ({time.monotonic() - started:.0f} s)", flush=True)
        print(f"  low load: {rounds} rounds of {per_round} probes per path", flush=True)
        low = await latency_rounds(paths, rounds, per_round)
        print(f"  throughput: {t_rounds} rounds, {streams} streams, {seconds:g} s", flush=True)
        tput = await _throughput(st, t_rounds, streams, seconds)
        capacity = {door: rate.tokens_per_second for door, rate in tput.items()}
        print(f"  at 80 % of capacity {capacity} ({time.monotonic() - started:.0f} s)", flush=True)
        loaded = await _loaded(st, capacity, 5 if quick else 100)
        print(f"  loaded done ({time.monotonic() - started:.0f} s)", flush=True)
        flames = await _flames(st, out, streams, 8) if getattr(args, "flame", False) else []
    figures = Figures(
        per_core={d: r.per_core_second for d, r in tput.items()},
        tokens_per_second={d: r.tokens_per_second for d, r in tput.items()},
        fairq_cores={d: r.fairq_cores for d, r in tput.items()},
        direct=(statistics.median(x[0] for x in low["direct"]),
                statistics.median(x[1] for x in low["direct"])),
        added_p50={d: _added(low, d, "direct", 0) for d in ("grpc", "http")},
        added_p99={d: _added(low, d, "direct", 1) for d in ("grpc", "http")},
        loaded_p99={d: v[0] for d, v in loaded.items()},
        loaded_cores={d: v[1] for d, v in loaded.items()},
        loaded_streams={d: v[2] for d, v in loaded.items()},
        replica_p50={d: _added(low, f"replica {d}", d, 0) for d in ("grpc", "http")},
        streams=streams,
        replicas=replicas,
        load_average=(load_before, os.getloadavg()[0]),
        rounds=(rounds, per_round, t_rounds, seconds),
    )  # fmt: skip
    write_page(out, figures, quick=quick, as_before=getattr(args, "as_before", False),
               flames=[p.name for p in flames])  # fmt: skip
    # A guard against collapse, not the targets (those are on the page): a shared 2-core
    # machine under other load moves every figure by milliseconds.
    ms = 1000.0
    return (
        min(figures.per_core.values()) > 2_000
        and max(figures.added_p50.values()) * ms < 25
        and max(figures.loaded_p99.values()) * ms < 2_000
        and max(figures.replica_p50.values()) * ms < 25
    )
