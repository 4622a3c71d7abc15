"""The usage ledger under faults: three replicas sharing Redis and PostgreSQL on the simulator.

Two runs of the same workload (short requests with ``ignore_eos``, so each asks for exactly
its ``max_tokens``), spread round-robin over three ``fairq serve`` replicas:

- **fault run**: replica 2 is SIGKILLed a third of the way in (what it held is lost: the
  requests in flight on it, and the rows it had not yet written), and PostgreSQL is stopped
  for a few seconds and restarted two thirds of the way in (the replicas keep serving; their
  rows wait in memory and are retried). The others are stopped with SIGTERM at the end.
- **SIGTERM run**: no faults; all replicas stopped with SIGTERM at the end.

Then the ledger's output tokens are compared with the backend's own count
(``vllm:generation_tokens_total`` of the simulator) and with what the clients received.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
from sqlalchemy import func, select

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.load import ChildProcess, start_fairq
from fairq_bench.postgres_process import PostgresProcess
from fairq_bench.processes import sim_process
from fairq_bench.redis_process import RedisProcess
from fairq_bench.report import markdown_table
from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import open_engine
from fairq_server.store.schema import usage

__all__ = ["ledger"]

_GENERATED = re.compile(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", re.MULTILINE)
_REPLICAS = 3
_CONCURRENCY = 48


@dataclass
class Sent:
    """What the clients saw, per replica."""

    finished: list[int] = field(default_factory=lambda: [0] * _REPLICAS)
    finished_tokens: list[int] = field(default_factory=lambda: [0] * _REPLICAS)
    failed: list[int] = field(default_factory=lambda: [0] * _REPLICAS)
    in_flight_at_kill: int = 0


@dataclass
class RunResult:
    name: str
    requests: int
    seconds: float
    backend_tokens: int
    ledger_rows: dict[str, int]
    ledger_tokens: dict[str, int]
    sent: Sent
    write_errors: float


def _config(sim_url: str, replica: int, redis_url: str, pg_url: str) -> str:
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\npoll_interval_seconds = 0.1\n"
        '[[tiers]]\nname = "standard"\nmax_backend_waiting = 8\n'
        f'[[backends]]\nid = "sim"\nkind = "vllm"\nbase_url = "{sim_url}"\nmodels = ["sim"]\n'
        f'[cluster]\nredis_url = "{redis_url}"\nreplica_id = "replica-{replica}"\n'
        f'[store]\nurl = "{pg_url}"\nflush_seconds = 1.0\nconnect_timeout_seconds = 2.0\n'
        "[prices.sim]\ninput_per_million = 0.5\noutput_per_million = 1.5\n"
    )


async def _backend_tokens(session: aiohttp.ClientSession, sim_url: str) -> int:
    async with session.get(f"{sim_url}/metrics") as resp:
        text = await resp.text()
    return int(sum(float(v) for v in _GENERATED.findall(text)))


async def _metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    try:
        async with session.get(url) as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return 0.0
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _ledger(pg_url: str) -> tuple[dict[str, int], dict[str, int]]:
    engine = await open_engine(StoreConfig(url=pg_url))
    try:
        query = select(usage.c.replica, func.count(), func.sum(usage.c.output_tokens)).group_by(
            usage.c.replica
        )
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).all()
    finally:
        await engine.dispose()
    return {r[0]: int(r[1]) for r in rows}, {r[0]: int(r[2] or 0) for r in rows}


async def _run(name: str, requests: int, sim_url: str, pg: PostgresProcess,
               redis: RedisProcess, faults: bool) -> RunResult:  # fmt: skip
    pg_url = pg.create_database(f"ledger_{name}")
    replicas: list[ChildProcess] = []
    for i in range(_REPLICAS):  # one after the other: a loaded machine starts each faster
        config = _config(sim_url, i, redis.url, pg_url)
        replicas.append(await start_fairq(config, metrics=True, ready_timeout=300))
    channels = [grpc.aio.insecure_channel(r.address) for r in replicas]
    stubs = [scheduler_pb2_grpc.SchedulerStub(c) for c in channels]
    sent = Sent()
    alive = set(range(_REPLICAS))
    in_flight = [0] * _REPLICAS
    rng = random.Random(7)
    gate = asyncio.Semaphore(_CONCURRENCY)
    write_errors = 0.0

    async def one(i: int) -> None:
        async with gate:
            replica = i % _REPLICAS
            if replica not in alive:
                replica = sorted(alive)[i % len(alive)]
            sampling = scheduler_pb2.SamplingParams(max_tokens=rng.randint(4, 24), ignore_eos=True)
            req = scheduler_pb2.GenerateRequest(
                model="sim", prompt=f"request {i}", request_id=f"{name}-{i}", sampling=sampling
            )
            md = (("x-fairq-user", f"user-{i % 20}"),)
            in_flight[replica] += 1
            try:
                tokens = 0
                async for event in stubs[replica].Generate(req, metadata=md, timeout=120):
                    if event.WhichOneof("event") == "finished":
                        tokens = event.finished.usage.completion_tokens
                sent.finished[replica] += 1
                sent.finished_tokens[replica] += tokens
            except grpc.aio.AioRpcError:
                sent.failed[replica] += 1
            finally:
                in_flight[replica] -= 1

    async with aiohttp.ClientSession() as session:
        before = await _backend_tokens(session, sim_url)
        started = time.monotonic()
        tasks = []
        for i in range(requests):
            tasks.append(asyncio.create_task(one(i)))
            if faults and i == requests // 3:
                await asyncio.sleep(1.0)  # let the requests started so far get going
                sent.in_flight_at_kill = in_flight[2]
                alive.discard(2)
                replicas[2].kill()
            if faults and i == 2 * requests // 3:
                await asyncio.sleep(0.5)
                await asyncio.to_thread(pg.stop)
                await asyncio.sleep(3.0)  # rows pile up; writes fail and are retried
                write_errors = sum(
                    [
                        await _metric(session, r.metrics_url, "fairq_ledger_write_errors_total")
                        for k, r in enumerate(replicas)
                        if k in alive
                    ]
                )
                await asyncio.to_thread(pg.start)
        await asyncio.gather(*tasks)
        seconds = time.monotonic() - started
        for channel in channels:
            await channel.close()
        for k, replica in enumerate(replicas):
            if k in alive:
                replica.signal(15)
        for replica in replicas:
            await replica.stop(timeout=30)
        backend = await _backend_tokens(session, sim_url) - before
    rows, tokens = await _ledger(pg_url)
    return RunResult(name, requests, seconds, backend, rows, tokens, sent, write_errors)


def _markdown(runs: list[RunResult], reproduce: str) -> str:
    lines = [
        "# Usage ledger: three replicas, a replica killed, PostgreSQL restarted",
        "",
        "Three `fairq serve` replicas share Redis and one PostgreSQL (`[store]`), in front of "
        "one simulated vLLM; requests go round-robin over the replicas (`ignore_eos`, 4-24 "
        "output tokens each, 48 in flight). The **fault run** SIGKILLs replica 2 a third of "
        "the way in and stops PostgreSQL for 3 s two thirds of the way in; the **SIGTERM run** "
        "has no faults. Every surviving replica is stopped with SIGTERM at the end.",
        "",
        f"Reproduce: `{reproduce}`",
        "",
    ]
    lines += [_result(runs), ""]
    header = ["run", "requests", "s", "backend tokens", "ledger tokens", "difference",
              "ledger rows", "rows expected (survivors)", "write errors while PG down"]  # fmt: skip
    table = []
    for r in runs:
        killed = 2 if r.name == "fault" else -1
        expected = sum(
            r.sent.finished[k] + r.sent.failed[k] for k in range(_REPLICAS) if k != killed
        )
        got = sum(n for rep, n in r.ledger_rows.items() if rep != f"replica-{killed}")
        total = sum(r.ledger_tokens.values())
        errors = f"{r.write_errors:.0f}"
        table.append([r.name, r.requests, f"{r.seconds:.0f}", r.backend_tokens, total,
                      r.backend_tokens - total, got, expected, errors])  # fmt: skip
    lines += [markdown_table(header, table), ""]
    for r in runs:
        if r.name != "fault":
            continue
        k = 2
        ledger_k = r.ledger_tokens.get("replica-2", 0)
        rows_k = r.ledger_rows.get("replica-2", 0)
        missing = r.backend_tokens - sum(r.ledger_tokens.values())
        lost_tokens = r.sent.finished_tokens[k] - ledger_k
        lines += [
            "## What the killed replica took with it (fault run)",
            "",
            markdown_table(
                ["", "requests", "output tokens"],
                [
                    [
                        "finished on replica 2 (clients' count)",
                        r.sent.finished[k],
                        r.sent.finished_tokens[k],
                    ],
                    ["of those, in the ledger", rows_k, ledger_k],
                    [
                        "lost from its unwritten buffer (at most 1 s of rows)",
                        r.sent.finished[k] - rows_k,
                        r.sent.finished_tokens[k] - ledger_k,
                    ],
                    [
                        "in flight on it when killed (failed at the client)",
                        r.sent.in_flight_at_kill,
                        "-",
                    ],
                ],
            ),
            "",
            "Backend tokens not in the ledger = the killed replica's lost rows plus the tokens "
            "the backend made for its in-flight requests before they were aborted: "
            f"{missing} - {lost_tokens} = {missing - lost_tokens} "
            f"tokens for {r.sent.in_flight_at_kill} in-flight requests.",
            "",
        ]
        survivors = [0, 1]
        sent_tokens = sum(r.sent.finished_tokens[s] for s in survivors)
        got_tokens = sum(r.ledger_tokens.get(f"replica-{s}", 0) for s in survivors)
        lines += [
            f"Survivors (replicas 0 and 1): clients received {sent_tokens} output tokens, the "
            f"ledger holds {got_tokens}: {'equal' if sent_tokens == got_tokens else 'NOT equal'}, "
            "PostgreSQL's restart notwithstanding.",
            "",
        ]
    return "\n".join(lines)


def _result(runs: list[RunResult]) -> str:
    """The one line the benchmarks README quotes."""
    parts = []
    for r in runs:
        total = sum(r.ledger_tokens.values())
        if r.name == "sigterm":
            same = "=" if total == r.backend_tokens else "!="
            rows = sum(r.ledger_rows.values())
            parts.append(f"SIGTERM run: ledger {total} {same} backend {r.backend_tokens} tokens, "
                         f"{rows} rows for {r.requests} requests")  # fmt: skip
        else:
            sent = sum(r.sent.finished_tokens[s] for s in (0, 1))
            got = sum(r.ledger_tokens.get(f"replica-{s}", 0) for s in (0, 1))
            lost = r.sent.finished[2] - r.ledger_rows.get("replica-2", 0)
            parts.append(f"fault run: survivors' ledger {got} {'=' if got == sent else '!='} "
                         f"{sent} tokens their clients received; the killed replica lost "
                         f"{lost} unwritten rows and {r.sent.in_flight_at_kill} in-flight "
                         "requests")  # fmt: skip
    return "**Result:** " + "; ".join(parts) + "."


async def ledger(args: argparse.Namespace, backend_url: str, out: Path) -> bool:
    """Run the fault run and the SIGTERM run; write ``ledger.md``."""
    requests = 1000 if args.quick else 10_000
    with PostgresProcess.running_server() as pg, RedisProcess.running() as redis:
        async with sim_process("--max-num-seqs", "64", "--speed", "20") as sim_url:
            fault = await _run("fault", requests, sim_url, pg, redis, faults=True)
            clean = await _run("sigterm", requests, sim_url, pg, redis, faults=False)
    reproduce = "fairq bench ledger" + (" --quick" if args.quick else " --write-docs")
    text = _markdown([fault, clean], reproduce)
    (out / "ledger.md").write_text(text + "\n")
    print(text, flush=True)
    clean_ok = sum(clean.ledger_tokens.values()) == clean.backend_tokens
    clean_ok &= sum(clean.ledger_rows.values()) == clean.requests
    survivors_ok = all(
        fault.ledger_tokens.get(f"replica-{s}", 0) == fault.sent.finished_tokens[s] for s in (0, 1)
    )
    return clean_ok and survivors_ok
