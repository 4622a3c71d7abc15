"""``fairq serve`` with a store, as a real process: SIGTERM writes every row; a store that
cannot work stops it at start with one line naming the key."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import grpc
import pytest

from fairq.v1 import scheduler_pb2, scheduler_pb2_grpc
from fairq_bench.load import start_fairq
from fairq_bench.load.children import free_port
from fairq_sim import SimServer

from .helpers import read_rows


def serve_config(sim: SimServer, store: str) -> str:
    return (
        'listen = "127.0.0.1:0"\n'
        "[scheduler]\npoll_interval_seconds = 0.05\n"
        f'[[backends]]\nid = "sim-a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
        f"[store]\n{store}\n"
        "[prices.sim]\ninput_per_million = 1.0\noutput_per_million = 3.0\n"
    )


@pytest.mark.timeout(300)
async def test_sigterm_writes_every_buffered_row(sim: SimServer, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # Batches that never fill and an hour-long interval: only the stop writes anything.
    fairq = await start_fairq(
        serve_config(sim, f'url = "{url}"\nbatch_rows = 10000\nflush_seconds = 3600.0')
    )
    try:
        async with grpc.aio.insecure_channel(fairq.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)

            async def one(i: int) -> int:
                req = scheduler_pb2.GenerateRequest(
                    model="sim", prompt="hello", request_id=f"req-{i}",
                    sampling=scheduler_pb2.SamplingParams(max_tokens=5),
                )  # fmt: skip
                events = [
                    r async for r in stub.Generate(req, metadata=(("x-fairq-user", f"u{i % 3}"),))
                ]
                return events[-1].finished.usage.completion_tokens

            tokens = await asyncio.gather(*(one(i) for i in range(30)))
        assert await read_rows(url) == []  # all still buffered
        fairq.signal(signal.SIGTERM)
        assert await fairq.wait(timeout=30) == 0, fairq.stderr_tail()
    finally:
        await fairq.stop()
    rows = await read_rows(url)
    assert sorted(r["request_id"] for r in rows) == sorted(f"req-{i}" for i in range(30))
    assert sum(r["output_tokens"] for r in rows) == sum(tokens) > 0
    assert all(r["outcome"] == "finished" and r["cost"] > 0 for r in rows)


BAD_STORES = {
    "scheme": ('[store]\nurl = "mysql://db/fairq"\n', "store.url must start with"),
    "unreachable": (
        '[store]\nurl = "postgresql://fairq@127.0.0.1:{port}/fairq"\n'
        "connect_timeout_seconds = 2.0\n",
        "store.url: cannot use the database postgresql+asyncpg://fairq@127.0.0.1:",
    ),
    "no-folder": ('[store]\nurl = "sqlite:////nonexistent/dir/f.db"\n', "store.url: folder"),
    "password-env": (
        '[store]\nurl = "postgresql://fairq@h/db"\npassword_env = "FAIRQ_TEST_UNSET_PW"\n',
        "store.password_env: FAIRQ_TEST_UNSET_PW is not set",
    ),
    "batch": ("[store]\nbatch_rows = 0\n", "store.batch_rows must be an integer >= 1"),
    "negative-price": (
        "[prices.sim]\ninput_per_million = -1.0\n",
        "prices.sim.input_per_million must be 0 or more",
    ),
    "unserved-price": (
        "[prices.gpt-9]\noutput_per_million = 1.0\n",
        "prices.gpt-9: no configured backend serves model 'gpt-9'",
    ),
    "price-key": ("[prices.sim]\nper_token = 1.0\n", "prices.sim: unknown keys ['per_token']"),
}


@pytest.mark.parametrize("case", sorted(BAD_STORES))
async def test_a_store_that_cannot_work_stops_serve_with_one_line(
    case: str, tmp_path: Path
) -> None:
    text, needle = BAD_STORES[case]
    path = tmp_path / "fairq.toml"
    path.write_text(
        'listen = "127.0.0.1:0"\n[[backends]]\nid = "s"\nkind = "vllm"\n'
        'base_url = "http://127.0.0.1:9"\nmodels = ["sim"]\n' + text.format(port=free_port())
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairq_server", "serve", "--config", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    message = err.decode()
    assert proc.returncode == 2, message[-500:]
    assert "Traceback" not in message
    lines = [line for line in message.splitlines() if line.startswith("fairq: ")]
    assert len(lines) == 1 and needle in lines[0], message[-800:]
