"""The HTTP door as ``fairq serve`` runs it: its own process, on the event loop it chooses.

``fairq serve`` runs on uvloop where it is installed, the in-process tests on asyncio's own
loop; a transport of the other loop must serve too (uvloop's TCP transport is no subclass of
``asyncio.Transport``, and the door once reset every connection under it).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp

from fairq_sim import SimServer


async def test_fairq_serve_answers_on_the_http_door(sim: SimServer, tmp_path: Path) -> None:
    config = tmp_path / "fairq.toml"
    config.write_text(
        'listen = "127.0.0.1:0"\nmetrics_listen = ""\n[http]\nlisten = "127.0.0.1:0"\n'
        f'[[backends]]\nid = "a"\nkind = "vllm"\nbase_url = "{sim.url}"\nmodels = ["sim"]\n'
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fairq_server", "serve", "--config", str(config), "--grace", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(60):
            # The door logs its port before the process says it serves.
            port = 0
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, "fairq serve exited before its HTTP door listened"
                if "fairq HTTP door on" in line:
                    port = int(line.rsplit("(port ", 1)[1].split(")")[0])
                    break
            assert (await proc.stdout.readline()).startswith(b"fairq serving on")
        base = f"http://127.0.0.1:{port}/v1"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/models") as resp:
                assert resp.status == 200
                assert [m["id"] for m in (await resp.json())["data"]] == ["sim"]
            body = {"model": "sim", "prompt": "Hello", "max_tokens": 4}
            async with session.post(f"{base}/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                answer = await resp.json()
        assert answer["usage"]["completion_tokens"] == 4
        assert answer["choices"][0]["finish_reason"] == "length"
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await proc.communicate()
    assert proc.returncode == 0
