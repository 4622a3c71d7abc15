"""docs/grpc-api.md: every `buf curl` block runs against a live fairq and does what it says.

The blocks run in document order (register before deregister) through bash, with the
documented address and backend URL replaced by the test's ephemeral ones. grpcurl is not
installable here; each grpcurl block must carry the same method, headers and request JSON
as the `buf curl` block before it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
from pathlib import Path

import pytest

from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, make_config, sim_backend

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "grpc-api.md"
BUF = ROOT / "clients" / "node" / "node_modules" / ".bin" / "buf"

needs_buf = pytest.mark.skipif(not BUF.exists(), reason="needs buf (make node)")


def blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.DOTALL)


def parts(block: str) -> tuple[str, list[str], str]:
    """(method path, headers, request JSON) of a buf curl or grpcurl block."""
    words = shlex.split(block.replace("\\\n", " "), posix=True)
    headers = [words[i + 1] for i, w in enumerate(words) if w == "-H"]
    data = next((words[i + 1] for i, w in enumerate(words) if w == "-d"), "")
    if words[0] == "buf":
        method = words[-1].split("50051", 1)[1].lstrip("/")
    else:
        method = words[-1] if words[-1] != "describe" else "describe"
    return method, headers, data


def test_each_grpcurl_block_matches_its_buf_curl_twin() -> None:
    found = blocks()
    pairs = [(a, b) for a, b in itertools.pairwise(found) if b.startswith("grpcurl")]
    assert len(pairs) == 8  # one per RPC, Generate twice, and reflection
    for buf_block, grpcurl_block in pairs:
        assert buf_block.startswith("buf curl")
        if "describe" in grpcurl_block:
            continue
        assert parts(buf_block) == parts(grpcurl_block)
        if parts(buf_block)[2]:
            json.loads(parts(buf_block)[2])  # the request is valid JSON


@needs_buf
async def test_every_buf_curl_block_works_against_a_live_fairq(
    sim: SimServer, fairq_factory: FairqFactory
) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=list(KEYS.values())))
    env = {**os.environ, "FAIRQ_API_KEY": "root-key", "PATH": f"{BUF.parent}:{os.environ['PATH']}"}
    outputs: dict[str, list[str]] = {}
    for block in (b for b in blocks() if b.startswith("buf curl")):
        command = block.replace("127.0.0.1:50051", f"127.0.0.1:{server.port}").replace(
            "http://127.0.0.1:8000", sim.url
        )
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", command, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, (block, err.decode())
        outputs.setdefault(parts(block)[0], []).append(out.decode())
    prompt, chat = outputs["fairq.v1.Scheduler/Generate"]
    assert '"queued"' in prompt and '"started"' in prompt and '"finished"' in prompt
    assert '"completionTokens": 16' in prompt
    assert '"requestId": "docs-1"' in chat and '"finished"' in chat
    assert '"vllm-b"' in outputs["fairq.v1.Admin/RegisterBackend"][0]
    listed = outputs["fairq.v1.Admin/ListBackends"][0]
    assert '"sim-a"' in listed and '"vllm-b"' in listed
    snapshot = json.loads(outputs["fairq.v1.Admin/GetQueueSnapshot"][0])
    assert snapshot["models"][0]["model"] == "sim"
    assert {b["status"]["backend"]["id"] for b in snapshot["backends"]} == {"sim-a", "vllm-b"}
    assert outputs["fairq.v1.Admin/DeregisterBackend"][0].strip() == "{}"
    assert server.core.backend("vllm-b") is None
    assert '"SERVING"' in outputs["grpc.health.v1.Health/Check"][0]
    assert "fairq.v1.Admin/GetQueueSnapshot" in outputs[""][0]
