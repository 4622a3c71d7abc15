"""The Python client's team, limit and audit methods against a real fairq with a store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fairq
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from ..store.helpers import store_config
from .test_node_client import needs_node, run_node


async def test_teams_limits_and_the_audit_log(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = store_config(f"sqlite:///{tmp_path / 'c.db'}", [sim_backend(sim)],
                          keys=tuple(KEYS.values()))  # fmt: skip
    server = await fairq_factory(config)
    target = f"127.0.0.1:{server.port}"
    async with fairq.AsyncClient(target, api_key="root-key") as client:
        assert await client.set_team("ops", 2.5) == fairq.Team("ops", 2.5, "store")
        assert await client.list_teams() == [fairq.Team("ops", 2.5, "store")]
        quota = fairq.Limit("quota", user="alice", tokens_per_day=1000, mode="soft")
        made = await client.set_limit(quota)
        assert made == fairq.Limit("quota", user="alice", tokens_per_day=1000, mode="soft",
                                   source="store")  # fmt: skip
        with pytest.raises(fairq.InvalidArgumentError, match=r"budget\.per_day must be a finite"):
            await client.set_limit(fairq.Limit("budget", team="ops", per_day=-1.0))
        with pytest.raises(ValueError, match="kind must be"):
            await client.delete_limit("rate", user="alice")  # type: ignore[arg-type]
        await client.delete_limit("quota", user="alice")
        with pytest.raises(fairq.NotFoundError):
            await client.delete_limit("quota", user="alice")
        assert await client.list_limits() == []
        entries = await client.audit_log(limit=2)
        assert [(e.action, e.actor, e.via) for e in entries] == [
            ("limit.delete", "root", "admin-api"),
            ("limit.set", "root", "admin-api"),
        ]
    async with fairq.AsyncClient(target, api_key="alice-key") as client:
        with pytest.raises(fairq.PermissionDeniedError):
            await client.list_teams()

    def blocking() -> list[fairq.AuditEntry]:
        with fairq.Client(target, api_key="root-key") as client:
            client.delete_team("ops")
            return client.audit_log(action="team.delete")

    assert [e.target for e in await asyncio.to_thread(blocking)] == ["ops"]


NODE_CALLS = """
import { createClient } from './src/client.js';
const client = createClient(process.argv[1], { apiKey: 'root-key' });
const out = (x) => console.log(JSON.stringify(x));
out(await client.setTeam('ops', 3));
out(await client.setLimit({ kind: 'budget', team: 'ops', per_month: 12.5, mode: 'soft' }));
out(await client.listLimits());
try {
  await client.setLimit({ kind: 'quota', user: 'al' });
} catch (err) {
  out({ code: err.code, message: err.message });
}
await client.deleteLimit('budget', { team: 'ops' });
out((await client.auditLog({ limit: 3 })).map((e) => [e.action, e.target, e.actor]));
out(await client.listTeams());
client.close();
"""


@needs_node
async def test_the_node_client_manages_teams_and_limits(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = store_config(f"sqlite:///{tmp_path / 'n.db'}", [sim_backend(sim)],
                          keys=tuple(KEYS.values()))  # fmt: skip
    server = await fairq_factory(config)
    code, lines, err = await run_node(
        "--input-type=module", "-e", NODE_CALLS, f"127.0.0.1:{server.port}"
    )
    assert code == 0, err
    team, limit, listed, refused, audit, teams = lines
    assert team == {"name": "ops", "weight": 3, "source": "store"}
    assert limit["kind"] == "budget" and limit["team"] == "ops" and limit["per_month"] == 12.5
    assert limit["mode"] == "soft" and limit["source"] == "store"
    assert listed == [limit]
    assert "quota: no limit given" in refused["message"], refused
    assert audit == [
        ["limit.delete", "budget team 'ops' model *", "root"],
        ["limit.set", "budget team 'ops' model *", "root"],
        ["team.set", "ops", "root"],
    ]
    assert teams == [team]
