"""The one-process limit book: rolling minutes by the second, UTC days and months, settling,
and memory bounded by what is live (an injected clock: no sleeps)."""

from __future__ import annotations

import datetime as dt
import tracemalloc

from fairq_server.tenancy.books.book import (
    Grant,
    LimitKey,
    LimitUse,
    Measure,
    Refusal,
    Scope,
    Window,
)
from fairq_server.tenancy.books.local import LocalBook, period_end

T0 = dt.datetime(2026, 3, 31, 23, 59, 0, tzinfo=dt.UTC).timestamp()


def key(subject: str = "ann", window: Window = Window.MINUTE, model: str | None = None) -> LimitKey:
    return LimitKey(Scope.USER, subject, model, Measure.TOKENS, window)


def use(amount: float, limit: float, k: LimitKey | None = None) -> LimitUse:
    return LimitUse(k or key(), amount, limit)


def test_grants_until_the_limit_is_reached_then_refuses_with_when() -> None:
    book = LocalBook()
    first = book.reserve_now([use(60, 100)], T0)
    second = book.reserve_now([use(60, 100)], T0 + 10)  # 60 < 100: granted, now 120
    assert isinstance(first, Grant) and isinstance(second, Grant)
    assert second.used == (120.0,)
    refused = book.reserve_now([use(1, 100)], T0 + 20)
    assert isinstance(refused, Refusal)
    assert refused.used == 120.0
    # Below the limit again once the first second's 60 leaves the window: at T0 + 60.
    assert refused.retry_after == 40.0


def test_the_window_rolls_by_the_second() -> None:
    book = LocalBook()
    assert isinstance(book.reserve_now([use(100, 100)], T0), Grant)
    assert isinstance(book.reserve_now([use(1, 100)], T0 + 59.9), Refusal)
    assert isinstance(book.reserve_now([use(100, 100)], T0 + 60), Grant)
    assert book.used_now([key()], T0 + 60) == [100.0]
    assert book.used_now([key()], T0 + 121) == [0.0]


def test_settling_gives_back_what_was_not_used_in_the_second_it_was_granted() -> None:
    book = LocalBook()
    grant = book.reserve_now([use(100, 100)], T0)
    assert isinstance(grant, Grant)
    assert isinstance(book.reserve_now([use(1, 100)], T0 + 5), Refusal)
    book.settle_now(grant, [30], T0 + 5)
    assert book.used_now([key()], T0 + 5) == [30.0]
    assert isinstance(book.reserve_now([use(50, 100)], T0 + 6), Grant)
    # The 30 leaves the window with the second it was granted in, the 50 later.
    assert book.used_now([key()], T0 + 60) == [50.0]


def test_a_grant_is_all_or_nothing_over_its_keys() -> None:
    book = LocalBook()
    team = LimitKey(Scope.TEAM, "ann", None, Measure.TOKENS, Window.MINUTE)  # same name, apart
    assert isinstance(book.reserve_now([use(10, 10, team)], T0), Grant)
    refused = book.reserve_now([use(5, 100), use(5, 10, team)], T0)
    assert isinstance(refused, Refusal) and refused.use.key == team
    assert book.used_now([key(), team], T0) == [0.0, 10.0]  # the user's part was not granted


def test_calendar_windows_are_utc_days_and_months() -> None:
    book = LocalBook()
    day, month = key(window=Window.DAY), key(window=Window.MONTH)
    assert isinstance(book.reserve_now([use(10, 10, day), use(10, 100, month)], T0), Grant)
    refused = book.reserve_now([use(1, 10, day)], T0 + 1)
    assert isinstance(refused, Refusal) and refused.retry_after == 59.0  # midnight UTC
    # 1 April: a new day and a new month.
    assert book.used_now([day, month], T0 + 60) == [0.0, 0.0]
    assert period_end(Window.MONTH, T0) == T0 + 60
    december = dt.datetime(2026, 12, 15, tzinfo=dt.UTC).timestamp()
    assert period_end(Window.MONTH, december) == dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()


def test_names_are_kept_apart_verbatim() -> None:
    book = LocalBook()
    names = ["ann", "ANN", "änn", "ann ", "a" * 256, "sk-" + "x" * 48, "ann\u200b", "*"]
    for i, name in enumerate(names):
        assert isinstance(book.reserve_now([use(i + 1, 1000, key(name))], T0), Grant)
    assert book.used_now([key(n) for n in names], T0) == [float(i + 1) for i in range(8)]


def test_memory_is_bounded_by_what_is_live_not_by_history() -> None:
    book = LocalBook()
    now = T0
    for i in range(2000):  # one user, a request every 0.1 s for 200 s: at most 60 buckets
        book.reserve_now([use(1, 1e9)], now + i * 0.1)
    assert len(book._counters[key()].buckets) <= 61  # type: ignore[union-attr]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(20_000):  # 20,000 users seen once each, over 200 s
        book.reserve_now([use(1, 1e9, key(f"user-{i}"))], now + 200 + i * 0.01)
    after_burst = len(book)
    later = now + 200 + 200 + 61
    book.reserve_now([use(1, 1e9)], later)  # a sweep is due: one slice of it per reservation
    assert len(book) >= after_burst - 256
    for i in range(1, 100):  # spread over the next reservations, it drops them all
        book.reserve_now([use(1, 1e9)], later + i * 0.01)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert after_burst > 5_000
    assert len(book) <= 2
    assert grown < 2_000_000  # what the burst left behind is gone (dict slack aside)
