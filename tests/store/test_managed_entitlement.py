"""Team weights, quotas and budgets set over the Admin RPCs: checked by the file's rules,
audited, merged with the file's entries, and in force on a second replica sharing the store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from fairq.v1 import admin_pb2, admin_pb2_grpc
from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.schema import Config
from fairq_server.config.teams import TeamConfig
from fairq_server.errors import InvalidRequestError
from fairq_server.store.entitlement import Stored
from fairq_server.tenancy.managed import effective
from fairq_server.tenancy.teams import team_weights
from fairq_sim import SimServer

from ..conftest import KEYS, FairqFactory, make_config, sim_backend
from .helpers import PRICES, store_config, until
from .test_stored_keys import ROOT, bearer, generate

QUOTA, BUDGET = admin_pb2.LIMIT_KIND_QUOTA, admin_pb2.LIMIT_KIND_BUDGET
FILE, STORE = admin_pb2.ENTRY_SOURCE_FILE, admin_pb2.ENTRY_SOURCE_STORE


def _config(url: str, sim: SimServer) -> Config:
    config = store_config(url, [sim_backend(sim)], keys=tuple(KEYS.values()))
    return replace(
        config,
        teams=(TeamConfig("red", 3.0),),
        quotas=(QuotaConfig(user="bob", requests_per_minute=100),),
    )


async def _refused(
    admin: admin_pb2_grpc.AdminStub, method: str, request: object
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await getattr(admin, method)(request, metadata=ROOT)
    return info.value.code(), info.value.details() or ""


async def test_admin_rpcs_change_every_replica_and_are_audited(
    sim: SimServer, fairq_factory: FairqFactory, store_url: str
) -> None:
    a = await fairq_factory(_config(store_url, sim))
    b = await fairq_factory(_config(store_url, sim))
    assert b.managed is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{a.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        # Admin only.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.SetTeam(
                admin_pb2.SetTeamRequest(team=admin_pb2.Team(name="x", weight=1)),
                metadata=bearer("alice-key"),
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Bad input: INVALID_ARGUMENT naming the field, by the file's own rules.
        bad: list[tuple[str, object, str]] = [
            ("SetTeam", admin_pb2.SetTeamRequest(team=admin_pb2.Team(name="x")),
             "team.weight must be a finite number above 0"),
            ("SetTeam", admin_pb2.SetTeamRequest(team=admin_pb2.Team(name="", weight=1)),
             "team.name must be a non-empty string"),
            ("SetTeam", admin_pb2.SetTeamRequest(team=admin_pb2.Team(name="a\nb", weight=1)),
             "team.name"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(user="al")),
             "limit.kind must be"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(kind=QUOTA, user="al")),
             "quota: no limit given"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(
                kind=QUOTA, user="al", tokens_per_day=5, mode="loud")), "quota.mode must be"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(
                kind=QUOTA, team="al", user="al", tokens_per_day=5)),
             "quota: give exactly one of team and user"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(
                kind=QUOTA, team="green", tokens_per_day=5)),
             "quota.team: team 'green' is not configured"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(
                kind=BUDGET, user="al", per_day=1, model="nope")),
             "budget.model: no configured backend serves model 'nope'"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(
                kind=BUDGET, user="al", per_day=-1)), "budget.per_day must be a finite number"),
            ("SetLimit", admin_pb2.SetLimitRequest(limit=admin_pb2.Limit(
                kind=BUDGET, user="al", per_day=1, tokens_per_day=5)), "are for quotas"),
            ("DeleteLimit", admin_pb2.DeleteLimitRequest(kind=QUOTA), "exactly one of team"),
            ("ListAuditLog", admin_pb2.ListAuditLogRequest(limit=1001), "at most 1000"),
            ("ListAuditLog", admin_pb2.ListAuditLogRequest(action="x"), "action must be one"),
        ]  # fmt: skip
        for method, request, needle in bad:
            code, details = await _refused(admin, method, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, details)
            assert needle in details, (method, details)

        # A new team, and a stored weight overriding the file's team of the same name.
        made = await admin.SetTeam(
            admin_pb2.SetTeamRequest(team=admin_pb2.Team(name="blue", weight=2)), metadata=ROOT
        )
        assert (made.team.name, made.team.weight, made.team.source) == ("blue", 2.0, STORE)
        await admin.SetTeam(
            admin_pb2.SetTeamRequest(team=admin_pb2.Team(name="red", weight=5)), metadata=ROOT
        )
        listed = await admin.ListTeams(admin_pb2.ListTeamsRequest(), metadata=ROOT)
        assert [(t.name, t.weight, t.source) for t in listed.teams] == [
            ("red", 5.0, STORE), ("blue", 2.0, STORE)
        ]  # fmt: skip
        # The other replica resolves the weights from its next poll on, without a restart.
        # Both changes, each its own version: a poll between them may bring blue alone.
        await until(
            lambda: (team_weights(b.core.config.teams).weight("blue"),
                     team_weights(b.core.config.teams).weight("red")) == (2.0, 5.0),
            timeout=5,
        )  # fmt: skip
        assert team_weights(a.core.config.teams).weight("blue") == 2.0  # at once where made

        # A hard quota set on a refuses alice's second request on b.
        quota = admin_pb2.Limit(kind=QUOTA, user="alice", requests_per_minute=1)
        await admin.SetLimit(admin_pb2.SetLimitRequest(limit=quota), metadata=ROOT)
        await until(lambda: any(q.user == "alice" for q in b.managed.effective().quotas))
        b_target = f"127.0.0.1:{b.port}"
        assert await generate(b_target, "alice-key") == grpc.StatusCode.OK
        assert await generate(b_target, "alice-key") == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The refusal names the entry's source: the store, not a place in the file.
        entitlement = b.core.dispatcher.entitlement
        assert entitlement is not None
        refused = entitlement.refusal("alice", None, "sim")
        assert "hard requests_per_minute of user 'alice' (store)" in str(refused)

        # A stored quota overrides the file's of the same subject; deleting it brings that back.
        bob = admin_pb2.Limit(kind=QUOTA, user="bob", tokens_per_minute=50, mode="soft")
        await admin.SetLimit(admin_pb2.SetLimitRequest(limit=bob), metadata=ROOT)
        limits = (await admin.ListLimits(admin_pb2.ListLimitsRequest(), metadata=ROOT)).limits
        assert [(x.user, x.tokens_per_minute, x.requests_per_minute, x.mode, x.source)
                for x in limits] == [("bob", 50, 0, "soft", STORE),
                                     ("alice", 0, 1, "hard", STORE)]  # fmt: skip
        forget = admin_pb2.DeleteLimitRequest(kind=QUOTA, user="bob")
        await admin.DeleteLimit(forget, metadata=ROOT)
        limits = (await admin.ListLimits(admin_pb2.ListLimitsRequest(), metadata=ROOT)).limits
        assert [(x.user, x.requests_per_minute, x.source) for x in limits] == [
            ("bob", 100, FILE), ("alice", 1, STORE)
        ]  # fmt: skip
        code, _ = await _refused(admin, "DeleteLimit", forget)
        assert code == grpc.StatusCode.NOT_FOUND
        await admin.DeleteTeam(admin_pb2.DeleteTeamRequest(name="red"), metadata=ROOT)
        await until(lambda: team_weights(b.core.config.teams).weight("red") == 3.0, timeout=5)
        code, _ = await _refused(admin, "DeleteTeam", admin_pb2.DeleteTeamRequest(name="red"))
        assert code == grpc.StatusCode.NOT_FOUND

        # Every change is in the audit log, newest first, with who made it; filtered by action.
        audit = await admin.ListAuditLog(admin_pb2.ListAuditLogRequest(), metadata=ROOT)
        assert [(e.action, e.target) for e in audit.entries] == [
            ("team.delete", "red"),
            ("limit.delete", "quota user 'bob' model *"),
            ("limit.set", "quota user 'bob' model *"),
            ("limit.set", "quota user 'alice' model *"),
            ("team.set", "red"),
            ("team.set", "blue"),
        ]
        assert {(e.actor, e.via) for e in audit.entries} == {("root", "admin-api")}
        assert audit.entries[2].detail == "tokens_per_minute=50, soft"
        only = await admin.ListAuditLog(
            admin_pb2.ListAuditLogRequest(action="team.set", limit=1), metadata=ROOT
        )
        assert [(e.action, e.target) for e in only.entries] == [("team.set", "red")]


async def test_without_a_store_the_rpcs_say_so(sim: SimServer, fairq_factory: FairqFactory) -> None:
    server = await fairq_factory(make_config([sim_backend(sim)], keys=(KEYS["root-key"],)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        code, details = await _refused(admin, "ListTeams", admin_pb2.ListTeamsRequest())
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "without a [store]" in details


def test_the_override_rule_and_a_stored_entry_the_file_no_longer_allows() -> None:
    config = replace(
        make_config(),
        teams=(TeamConfig("red", 3.0), TeamConfig("ops", 1.0)),
        quotas=(QuotaConfig(team="red", tokens_per_day=10),
                QuotaConfig(user="*", tokens_per_day=5)),
        prices=PRICES,
    )  # fmt: skip
    stored = Stored(
        teams=(TeamConfig("ops", 4.0), TeamConfig("new", 2.0)),
        quotas=(QuotaConfig(team="red", tokens_per_day=99, mode="soft"),),
        # Its model is served and priced now; after a reload without the price it is left out.
        budgets=(BudgetConfig(user="al", model="sim", per_day=1.0),),
    )
    merged = effective(config, stored, {"sim"})
    assert [(t.name, t.weight) for t in merged.teams] == [("red", 3.0), ("ops", 4.0), ("new", 2.0)]
    assert [(q.team or q.user, q.tokens_per_day, q.mode) for q in merged.quotas] == [
        ("red", 99, "soft"), ("*", 5, "hard")
    ]  # fmt: skip
    assert [b.user for b in merged.budgets] == ["al"]
    assert merged.stored_teams == {"ops", "new"}
    assert merged.labels() == ["store", "quotas[1]", "store"]  # file entries keep their place
    reloaded = effective(replace(config, prices={}), stored, {"sim"})
    assert reloaded.budgets == ()
    assert reloaded.quotas == merged.quotas


async def test_a_reload_keeps_the_stored_entries_over_the_new_file(
    sim: SimServer, fairq_factory: FairqFactory, tmp_path: Path
) -> None:
    config = _config(f"sqlite:///{tmp_path / 'r.db'}", sim)
    server = await fairq_factory(config)
    assert server.managed is not None and server.core.dispatcher.entitlement is not None
    await server.managed.set_team("root", "admin-api", "red", 5.0)
    budget = BudgetConfig(user="alice", model="sim", per_day=0.5)
    await server.managed.set_limit("root", "admin-api", budget)
    assert server.core.dispatcher.entitlement.active
    # The new file weighs red 7 and adds blue: the stored red (5) still overrides it.
    reloaded = replace(config, teams=(TeamConfig("red", 7.0), TeamConfig("blue", 2.0)))
    await server.reload(reloaded)
    weights = team_weights(server.core.config.teams)
    assert (weights.weight("red"), weights.weight("blue")) == (5.0, 2.0)
    assert server.managed.effective().budgets == (budget,)
    # A file without the model's price: the stored budget is left out, not the reload refused.
    await server.reload(replace(reloaded, prices={}))
    assert server.managed.effective().budgets == ()
    assert team_weights(server.core.config.teams).weight("red") == 5.0
    # A stored team named by a stored quota stays while other teams are in force.
    await server.managed.set_team("root", "admin-api", "green", 1.0)
    quota = QuotaConfig(team="green", tokens_per_day=100)
    await server.managed.set_limit("root", "admin-api", quota)
    with pytest.raises(InvalidRequestError, match="team 'green' is named by the quota team"):
        await server.managed.delete_team("root", "admin-api", "green")
    assert await server.managed.delete_limit("root", "admin-api", "quota", "team", "green", "")
    assert await server.managed.delete_team("root", "admin-api", "green")
