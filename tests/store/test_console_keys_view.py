"""The keys view lists the configuration file's keys beside the stored ones, with each key's
expiry and last use: a stored key's own (before: its user's last request, the same on each of
a user's keys), a file key's user's last request."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import grpc

from fairq.v1 import scheduler_pb2_grpc
from fairq_server.config.schema import ConsoleConfig
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from ..http.console.conftest import generate
from .helpers import store_config

ROOT = {"Authorization": "Bearer root-key"}


async def test_keys_view_lists_file_keys_expiry_and_last_request(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = store_config(f"sqlite:///{tmp_path / 'fairq.db'}", [sim_backend(sim)],
                          keys=tuple(KEYS.values()))  # fmt: skip
    server = await fairq_factory(replace(config, console=ConsoleConfig(enabled=True)))
    assert server.store is not None
    expires = time.time() + 3 * 86400
    dee, _ = await server.store.keys.create("dee", expires_at=expires)
    used, secret = await server.store.keys.create("dee")  # dee's second key, the one she uses
    gone, _ = await server.store.keys.create("gone")
    await server.store.keys.revoke(gone.id)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for key in ("alice-key", secret):
            call = scheduler_pb2_grpc.SchedulerStub(channel).Generate(
                generate(), metadata=(("authorization", f"Bearer {key}"),)
            )
            assert [e.WhichOneof("event") async for e in call][-1] == "finished"
    url = f"http://127.0.0.1:{server.http_port}"
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/console/keys", headers=ROOT) as resp,
    ):
        assert resp.status == 200
        page = await resp.text()
    # The file's keys, in a table of their own (no id, no actions: the file is their home).
    file_rows = dict(re.findall(r'<tr data-file-key="([^"]+)">(.*?)</tr>', page))
    assert set(file_rows) == {"alice", "bob", "root"}
    assert re.search(r"\d+ s ago</time></td>$", file_rows["alice"])  # her request just now
    assert file_rows["bob"].endswith("<td>—</td>")  # no request in the last 30 days
    assert "<td>yes</td>" in file_rows["root"]  # admin
    # Stored keys: expiry, state, and no last request for users who made none.
    stored = dict(re.findall(r'<tr data-key="([^"]+)" data-state="(\w+)">', page))
    assert stored == {dee.id: "active", used.id: "active", gone.id: "revoked"}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires))
    [dee_row] = re.findall(rf'<tr data-key="{dee.id}".*?</tr>', page)
    assert f"<td>{when}</td>" in dee_row and "<td>—</td>" in dee_row
    assert "ago" not in dee_row  # never used (her other key was)
    [used_row] = re.findall(rf'<tr data-key="{used.id}".*?</tr>', page)
    assert re.search(r"<td><time[^>]*>\d+ s ago</time></td>", used_row)  # just now
    [gone_row] = re.findall(rf'<tr data-key="{gone.id}".*?</tr>', page)
    assert "<td>never</td>" in gone_row
