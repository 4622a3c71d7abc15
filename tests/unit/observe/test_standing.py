"""The queue view's reading of quotas and budgets: each counter once, a hard limit's end."""

from __future__ import annotations

from collections.abc import Sequence

from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.prices import PriceConfig
from fairq_server.tenancy.books.book import Grant, LimitKey, LimitUse, Refusal, Window
from fairq_server.tenancy.books.local import LocalBook, period_end
from fairq_server.tenancy.checker import Entitlement
from fairq_server.tenancy.standing import StandingReader

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC


class CountingBook:
    """A local book that counts the keys read (the view's cost) and may forget refusals."""

    def __init__(self, *, knows_refusals: bool = True) -> None:
        self.inner = LocalBook()
        self.read: list[LimitKey] = []
        self.knows_refusals = knows_refusals

    def reserve_now(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        answer = self.inner.reserve_now(uses, now)
        if isinstance(answer, Refusal) and not self.knows_refusals:
            # As a cluster replica that was not refused itself answers a question.
            return Grant(None, tuple(uses), (answer.used,))
        return answer

    def settle_now(self, grant: Grant, actual: Sequence[float], now: float) -> None:
        self.inner.settle_now(grant, actual, now)

    def used_now(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        self.read += keys
        return self.inner.used_now(keys, now)


def entitlement(book: CountingBook) -> Entitlement:
    found = Entitlement(book, clock=lambda: T0)
    found.configure(
        [
            QuotaConfig(team="ops", tokens_per_minute=100),
            QuotaConfig(user="*", requests_per_minute=10, mode="soft"),
        ],
        [BudgetConfig(team="ops", per_month=1.0)],
        {"m": PriceConfig(input_per_million=100.0, output_per_million=100.0)},
    )
    return found


def spend(found: Entitlement, user: str, tokens: int) -> None:
    claim = found.reserve(user, "ops", "m", tokens, 0)
    assert claim is not None and not isinstance(claim, Exception)
    found.settle(claim, tokens, 0)


def test_each_counter_is_read_once_per_view_and_states_follow_use() -> None:
    book = CountingBook()
    found = entitlement(book)
    spend(found, "ann", 90)  # ops: 90 of 100 tokens a minute, 0.009 of 1.0 a month
    reader = StandingReader(found, {"ops": 2.0})
    book.read.clear()
    ann = reader.for_user("ann", "ops", "m")
    bob = reader.for_user("bob", "ops", "m")
    assert reader.for_user("ann", "ops", "m") is ann  # asked twice (two tiers): once read
    teams = reader.teams()
    # ops's two counters, ann's and bob's own: four reads for two users and the team table.
    assert len(book.read) == 4
    by_kind = {(r.subject, r.kind): r for r in ann}
    assert by_kind[("ops", "tokens_per_minute")].state == "warn"  # 90 %
    assert by_kind[("ops", "budget_per_month")].state == ""
    assert by_kind[("ann", "requests_per_minute")].used == 1.0
    assert {(r.subject, r.used) for r in bob} >= {("bob", 0.0), ("ops", 90.0)}
    [ops] = teams
    assert (ops.team, ops.weight, len(ops.limits)) == ("ops", 2.0, 2)


def test_a_reached_hard_limit_says_until_when() -> None:
    for knows, until in ((True, T0 + 60.0), (False, T0 + 60.0)):
        book = CountingBook(knows_refusals=knows)
        found = entitlement(book)
        spend(found, "ann", 120)
        [tokens, _budget] = StandingReader(found, {}).teams()[0].limits
        assert (tokens.state, tokens.until) == ("over", until)
    # A month's budget reached: refused until the month's end (UTC), whoever answers.
    for knows in (True, False):
        book = CountingBook(knows_refusals=knows)
        found = entitlement(book)
        spend(found, "ann", 10_000)  # 1.0 of 1.0 a month
        budget = StandingReader(found, {}).teams()[0].limits[1]
        assert (budget.kind, budget.state) == ("budget_per_month", "over")
        assert budget.until == period_end(Window.MONTH, T0)
