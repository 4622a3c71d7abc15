"""The public surface: exported names, the CLI, and the threaded server for sync code."""

from __future__ import annotations

import asyncio
import inspect
import signal
import socket
import subprocess
import sys

import httpx
import pytest

import fairq_sim as sim_pkg
from fairq_bench.load import start_sim
from fairq_sim import SimConfig, SimServer, ThreadedSimServer, create_app
from fairq_sim.cli import build_parser, config_from_args, main
from tests.reliability.helpers import until_async

EXPECTED_EXPORTS = {
    "PROFILES",
    "Engine",
    "EngineConfig",
    "EngineObserver",
    "FinishReason",
    "ManualClock",
    "Measurements",
    "Profile",
    "RequestStatus",
    "SimConfig",
    "SimMode",
    "SimRequest",
    "SimServer",
    "SimState",
    "StepPlan",
    "ThreadedSimServer",
    "TokenOutput",
    "calibrate",
    "create_app",
    "get_profile",
    "sim_state",
}


def test_exported_members_are_pinned() -> None:
    assert set(sim_pkg.__all__) == EXPECTED_EXPORTS
    for name in sim_pkg.__all__:
        assert getattr(sim_pkg, name) is not None


def test_public_signatures() -> None:
    assert list(inspect.signature(create_app).parameters) == ["config"]
    assert list(inspect.signature(main).parameters) == ["argv"]
    fields = {f for f in SimConfig.__dataclass_fields__}
    assert {
        "mode", "model", "profile", "max_num_seqs", "speed", "priority_mode", "max_model_len",
        "kv_blocks", "block_size", "seed", "startup_delay", "error_rate", "drop_after_tokens",
        "metrics_fail", "metrics_delay",
    } <= fields  # fmt: skip
    defaults = SimConfig()
    assert (defaults.mode, defaults.model, defaults.profile) == ("vllm", "sim", "tiny-cpu")


def test_cli_arguments_map_to_config() -> None:
    args = build_parser().parse_args(
        [
            "--mode", "tgi", "--model", "m", "--profile", "llama-8b-gpu", "--max-num-seqs", "8",
            "--speed", "3", "--drop-after-tokens", "5", "--error-rate", "0.25", "--metrics-fail",
            "--startup-delay", "1.5", "--metrics-delay", "0.1", "--max-concurrent-requests", "2",
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert (config.mode, config.model, config.profile, config.max_num_seqs) == (
        "tgi",
        "m",
        "llama-8b-gpu",
        8,
    )
    assert (config.speed, config.drop_after_tokens, config.error_rate) == (3.0, 5, 0.25)
    assert config.metrics_fail and config.startup_delay == 1.5 and not config.priority_mode
    assert config.max_concurrent_requests == 2
    priority = config_from_args(build_parser().parse_args(["--scheduling-policy", "priority"]))
    assert priority.priority_mode


def test_cli_rejects_invalid_combination(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--mode", "tgi", "--scheduling-policy", "priority", "--port", "0"])
    assert info.value.code == 2
    assert "no priority scheduling" in capsys.readouterr().err


def test_cli_serves_until_sigterm() -> None:
    code = "import sys; from fairq_sim.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--port", "0", "--mode", "tgi", "--model", "cli-model"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        info = httpx.get(f"{url}/info", timeout=10).json()
        assert info["model_id"] == "cli-model"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_threaded_server_for_synchronous_code() -> None:
    with ThreadedSimServer(SimConfig(speed=50.0)) as sim:
        resp = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x", "max_tokens": 3})
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 3


async def test_sim_server_start_stop_are_explicit_and_idempotent() -> None:
    server = SimServer(SimConfig(speed=50.0))
    assert server.url == ""
    await server.start()
    try:
        with pytest.raises(RuntimeError):
            await server.start()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{server.url}/health")).status_code == 200
    finally:
        await server.stop()
    await server.stop()
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{server.url}/health")


async def test_stop_ends_open_streams() -> None:
    server = SimServer(SimConfig(speed=1.0))
    await server.start()
    async with httpx.AsyncClient(base_url=server.url) as client:
        body = {"prompt": "x", "max_tokens": 400, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.aiter_lines()
            await anext(lines)
            await server.stop()
            rest = [line async for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert any('"error"' in line for line in rest)


def test_cli_port_in_use_is_one_line_naming_the_address() -> None:
    """``fairq sim`` on a port another process listens on: one line, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "fairq_server", "sim", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"fairq sim: cannot listen on 127.0.0.1:{port} (set by --host/--port): address already "
        "in use (another process listens there; --port 0 picks a free port)"
    ], done.stderr


def _metric(text: str, name: str) -> float:
    """The value of the one sample ``name`` in an exposition."""
    lines = text.splitlines()
    return next(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))


async def test_sigusr1_holds_the_engine_and_sigusr2_releases_it() -> None:
    """``fairq sim`` in its own process: held, a request is queued on the engine and not run
    (still waiting a scrape after one found it there); released, it completes."""
    sim = await start_sim("--speed", "100")
    try:
        async with httpx.AsyncClient(base_url=sim.address, timeout=30) as client:

            async def answers(path: str, name: str = "", at_least: float = 0) -> bool:
                resp = await client.get(path)
                return resp.status_code == 200 and (
                    not name or _metric(resp.text, name) >= at_least
                )

            await until_async(lambda: answers("/health"), what="serving")  # handlers are in
            sim.signal(signal.SIGUSR1)
            body = {"model": "sim", "prompt": "x", "max_tokens": 3}
            request = asyncio.create_task(client.post("/v1/completions", json=body))
            waiting = "vllm:num_requests_waiting"
            await until_async(lambda: answers("/metrics", waiting, 1), what="request on the engine")
            held = (await client.get("/metrics")).text  # one more round trip: still held
            sim.signal(signal.SIGUSR2)
            answer = await request
    finally:
        code = await sim.stop()
    assert _metric(held, waiting) == 1
    assert _metric(held, "vllm:num_requests_running") == 0
    assert answer.status_code == 200
    assert answer.json()["usage"]["completion_tokens"] == 3
    assert code == 0
