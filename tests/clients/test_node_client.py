"""The Node.js client's CLI (clients/node/bin/generate.js) talking to Python servers.

Two polyglot checks: against the in-process fake (always, given Node and
``npm ci``), and end to end against the real fairq server with a simulated
backend (once ``fairq_server.service`` and the ``fairq_target``/``sim_model``
fixtures exist).

The CLI runs through ``asyncio.create_subprocess_exec`` so that the event loop
keeps serving an in-process server while the child process talks to it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

if TYPE_CHECKING:
    from .conftest import AioFake

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
CLI = NODE_DIR / "bin" / "generate.js"
NODE = shutil.which("node")
PATIENCE = 60.0

needs_node = pytest.mark.skipif(
    NODE is None or not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(),
    reason="needs node and `npm ci` in clients/node (make node)",
)


async def run_cli(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    """Run the CLI; return its exit code, its stdout as JSON lines, and stderr."""
    return await run_node(str(CLI), *args)


async def run_node(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    """Run node in the package's folder; return its exit code, stdout as JSON lines, stderr."""
    assert NODE is not None
    process = await asyncio.create_subprocess_exec(
        NODE,
        *args,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), PATIENCE)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    lines = [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]
    assert process.returncode is not None
    return process.returncode, lines, stderr.decode()


@needs_node
async def test_node_cli_against_the_python_fake(aio_fake: AioFake) -> None:
    code, events, stderr = await run_cli(
        *("--target", aio_fake.target, "--user", "bob", "--api-key", "k-1"),
        *("--model", "m", "--prompt", "hello", "--max-tokens", "8", "--stop", "\n"),
    )
    assert code == 0, stderr
    assert [e["type"] for e in events] == [
        "queued",
        "queued",
        "started",
        "chunk",
        "chunk",
        "finished",
    ]
    assert events[2] == {
        "type": "started",
        "backend_id": "vllm-a",
        "queue_seconds": 0.25,
        "tier": "interactive",
        "request_id": "r-1",
    }
    assert events[-1]["completion_tokens"] == 2
    (request,) = aio_fake.scheduler.seen.requests
    assert (request.model, request.prompt, request.sampling.max_tokens) == ("m", "hello", 8)
    assert list(request.sampling.stop) == ["\n"]
    (metadata,) = aio_fake.scheduler.seen.metadata
    assert metadata["authorization"] == "Bearer k-1"
    assert metadata["x-fairq-user"] == "bob"


@needs_node
async def test_node_cli_reports_a_python_abort(aio_fake: AioFake) -> None:
    aio_fake.scheduler.behaviour.script = []
    aio_fake.scheduler.behaviour.abort = (
        grpc.StatusCode.PERMISSION_DENIED,
        "tier 'interactive' is above your ceiling",
    )
    code, lines, _ = await run_cli("--target", aio_fake.target, "--model", "m", "--prompt", "hi")
    assert code == 1
    assert lines == [
        {
            "error": {
                "code": "PERMISSION_DENIED",
                "details": "tier 'interactive' is above your ceiling",
            }
        }
    ]


@needs_node
async def test_node_cli_against_fairq(fairq_target: str, sim_model: str) -> None:
    code, events, stderr = await run_cli(
        *("--target", fairq_target, "--user", "bob"),
        *("--model", sim_model, "--prompt", "hello", "--max-tokens", "8"),
    )
    assert code == 0, stderr
    kinds = [e["type"] for e in events]
    assert "started" in kinds
    assert kinds.count("chunk") >= 1
    assert kinds[-1] == "finished"
    assert kinds.index("started") < kinds.index("chunk")
    assert events[-1]["completion_tokens"] > 0


# The Node client itself (not the CLI, which sends prompts only) in a chat with a
# forced tool: the simulated vLLM answers with a call of it only if `tools` and
# `tool_choice` reached it through fairq.
NODE_TOOL_CALL = """
import { createClient } from './src/client.js';
const [target, model] = process.argv.slice(1);
const client = createClient(target, { user: 'carol' });
const tools = [{ type: 'function', function: { name: 'emit', parameters: { type: 'object' } } }];
const extra = { tools, tool_choice: { type: 'function', function: { name: 'emit' } } };
const messages = [{ role: 'user', content: 'hello' }];
try {
  for await (const event of client.generate({ model, messages, max_tokens: 4, extra })) {
    console.log(JSON.stringify(event));
  }
} finally {
  client.close();
}
"""


@needs_node
async def test_node_client_passes_extra_through_fairq(fairq_target: str, sim_model: str) -> None:
    code, events, stderr = await run_node(
        "--input-type=module", "-e", NODE_TOOL_CALL, fairq_target, sim_model
    )
    assert code == 0, stderr
    deltas = [
        choice["delta"]
        for e in events
        if e["type"] == "chunk" and "extra" in e
        for choice in e["extra"]["choices"]
    ]
    calls = [call for delta in deltas for call in delta.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "emit"
    assert events[-1]["type"] == "finished"
