"""Which limits hold for a request, and the dispatcher's calls on them (a one-process book)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.prices import PriceConfig
from fairq_server.errors import QuotaExceededError
from fairq_server.tenancy.books.book import Claim, Measure, Scope, Window
from fairq_server.tenancy.books.local import LocalBook
from fairq_server.tenancy.checker import Entitlement
from fairq_server.tenancy.metrics import EntitlementMetrics
from fairq_server.tenancy.rules import LimitTable
from fairq_server.tenancy.team_labels import TeamLabels

T0 = 1_800_000_000.0


def test_a_users_own_entry_replaces_the_default_for_its_model_only() -> None:
    table = LimitTable(
        [
            QuotaConfig(user="*", tokens_per_minute=10),
            QuotaConfig(user="*", model="llama", requests_per_minute=5),
            QuotaConfig(user="ann", model="llama", requests_per_minute=50),
            QuotaConfig(team="ops", tokens_per_day=1000, mode="soft"),
        ]
    )
    ann = table.applicable("ann", "ops", "llama")
    assert sorted((lim.kind, lim.subject, lim.limit) for lim in ann.limits) == [
        ("requests_per_minute", "ann", 50.0),
        ("tokens_per_day", "ops", 1000.0),
        ("tokens_per_minute", "*", 10.0),
    ]
    assert {k.subject for k in ann.keys} == {"ann", "ops"}  # the "*" entry counts per user
    assert [ann.limits[i].kind for i in ann.soft] == ["tokens_per_day"]
    bob = table.applicable("bob", None, "llama")
    assert sorted(lim.limit for lim in bob.limits) == [5.0, 10.0]
    assert table.applicable("bob", None, "other").keys[0].model is None
    # A team's key is one object whichever member asks (the book finds it by identity).
    cy = table.applicable("cy", "ops", "llama")
    team_key = next(k for k in ann.keys if k.scope is Scope.TEAM)
    assert any(k is team_key for k in cy.keys)


def make(*quotas: QuotaConfig, budgets: tuple[BudgetConfig, ...] = ()) -> tuple[
    Entitlement, list[float], CollectorRegistry
]:  # fmt: skip
    clock = [T0]
    registry = CollectorRegistry()
    entitlement = Entitlement(
        LocalBook(), EntitlementMetrics(registry, TeamLabels()), lambda: clock[0]
    )
    prices = {"llama": PriceConfig(input_per_million=1e6, output_per_million=2e6)}
    entitlement.configure(quotas, budgets, prices)
    return entitlement, clock, registry


def test_soft_limits_count_but_never_refuse_and_demote_while_over() -> None:
    entitlement, clock, _ = make(QuotaConfig(user="ann", tokens_per_minute=100, mode="soft"))
    for _ in range(5):
        claim = entitlement.reserve("ann", None, "llama", 30, 20)
        assert isinstance(claim, Claim)
    assert entitlement.refusal("ann", None, "llama") is None
    assert entitlement.demoted("ann", None, "llama")
    assert not entitlement.demoted("bob", None, "llama")
    clock[0] += 61
    assert not entitlement.demoted("ann", None, "llama")


def test_budgets_reserve_the_price_of_max_tokens_and_settle_the_real_cost() -> None:
    # 1 unit per input token, 2 per output token.
    entitlement, _, _ = make(budgets=(BudgetConfig(user="ann", per_day=100.0),))
    claim = entitlement.reserve("ann", None, "llama", 10, 40)  # 10 + 80 = 90 reserved
    assert isinstance(claim, Claim)
    key = claim.grant.uses[0].key
    assert (key.measure, key.window) == (Measure.COST, Window.DAY)
    assert entitlement.book.used_now([key], T0) == [90.0]
    entitlement.settle(claim, 10, 5)  # 10 + 10 = 20 used
    assert entitlement.book.used_now([key], T0) == [20.0]
    refused = entitlement.reserve("ann", None, "unpriced", 10, 4000)  # costs nothing
    assert isinstance(refused, Claim)
    over = entitlement.reserve("ann", None, "llama", 10, 40)
    assert isinstance(over, Claim)  # 20 < 100: granted, now 110
    error = entitlement.reserve("ann", None, "llama", 1, 1)
    assert isinstance(error, QuotaExceededError)
    assert "budget_per_day of user 'ann' (budgets[0]) reached: 110 of 100 used" in str(error)


def test_the_warning_comes_once_per_counter_and_window(caplog: pytest.LogCaptureFixture) -> None:
    entitlement, clock, registry = make(QuotaConfig(team="ops", requests_per_minute=10))
    with caplog.at_level(logging.WARNING):
        for _ in range(10):
            entitlement.reserve("ann", "ops", "llama", 1, 1)
        clock[0] += 61
        for _ in range(9):
            entitlement.reserve("ann", "ops", "llama", 1, 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0] == (
        "hard requests_per_minute of team 'ops' (quotas[0]) at 80% of its limit: 8 of 10 used"
    )
    labels = {"kind": "requests_per_minute", "scope": "team"}
    assert registry.get_sample_value("fairq_limit_warnings_total", labels) == 2.0
