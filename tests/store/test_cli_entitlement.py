"""``fairq teams``, ``fairq limits`` and ``fairq audit`` against one replica of two sharing a
store: the change made through one holds on the other, and the audit log names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fairq_server.tenancy.teams import team_weights
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, sim_backend
from .helpers import store_config, until
from .test_stored_keys import cli

AUTH = ("--api-key", "root-key")


@pytest.mark.timeout(300)  # six CLI runs, each a Python start; slow on a loaded machine
async def test_cli_sets_lists_and_deletes_teams_and_limits(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = store_config(f"sqlite:///{tmp_path / 'f.db'}", [sim_backend(sim)],
                          keys=tuple(KEYS.values()))  # fmt: skip
    a = await fairq_factory(config)
    b = await fairq_factory(config)
    target = ("--target", f"127.0.0.1:{a.port}")
    code, out, err = await cli("teams", "set", "ops", "3", *target, *AUTH, "--json")
    assert code == 0, err
    assert json.loads(out) == {"name": "ops", "weight": 3.0, "source": "store"}
    await until(lambda: team_weights(b.core.config.teams).weight("ops") == 3.0, timeout=5)
    code, out, err = await cli(
        "limits", "set", "budget", "--user", "*", "--per-day", "2.5", "--mode", "soft",
        *target, *AUTH,
    )  # fmt: skip
    assert code == 0 and "budget  user *" in out and "per_day=2.5, soft (store)" in out, out + err
    assert b.managed is not None
    await until(lambda: [x.user for x in b.managed.effective().budgets] == ["*"], timeout=5)
    # Refused input is named, and the tool exits 1.
    code, _, err = await cli("limits", "set", "quota", "--user", "al", *target, *AUTH)
    assert code == 1 and "INVALID_ARGUMENT: quota: no limit given" in err
    code, out, err = await cli("limits", "delete", "budget", "--user", "*", *target, *AUTH)
    assert code == 0 and out.strip() == "deleted", err
    code, out, err = await cli("audit", "--json", "--limit", "2", *target, *AUTH)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["action"], r["target"], r["actor"], r["via"]) for r in rows] == [
        ("limit.delete", "budget user '*' model *", "root", "admin-api"),
        ("limit.set", "budget user '*' model *", "root", "admin-api"),
    ]
    code, out, err = await cli("teams", "list", *target, *AUTH)
    assert code == 0 and out.splitlines()[1].split() == ["ops", "3", "store"], out + err
