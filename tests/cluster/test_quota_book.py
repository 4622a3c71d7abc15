"""The Redis limit book against a real redis-server: replicas at once, windows, names."""

from __future__ import annotations

import asyncio
import calendar
import time
from datetime import UTC, datetime

import pytest

from fairq_server.tenancy.books.book import Grant, LimitKey, LimitUse, Measure, Refusal, Scope
from fairq_server.tenancy.books.book import Window as W
from fairq_server.tenancy.books.redis import RedisBook, redis_key
from tests.cluster.quota_helpers import books, tpm


async def _redis_ms(book: RedisBook) -> int:
    seconds, micros = await book._client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_replicas_reserving_at_once_stay_within_the_limit_plus_one_amount(
    redis_url: str,
) -> None:
    limit, amount = 10_000.0, 700.0
    key, team = tpm("alice"), LimitKey(Scope.TEAM, "t", None, Measure.TOKENS, W.MINUTE)
    async with books(redis_url, 3) as replicas:

        async def replica(book: RedisBook) -> float:
            granted = 0.0
            for _ in range(40):
                uses = [LimitUse(key, amount, limit), LimitUse(team, amount, 1e9)]
                outcome = await book.reserve(uses, time.time())
                if isinstance(outcome, Grant):
                    granted += amount
            return granted

        totals = await asyncio.gather(*(replica(b) for b, _, _ in replicas))
        book = replicas[0][0]
        used = await book.used([key, team], time.time())
    # Granted while the sum was below the limit: ceil(limit / amount) grants, no more.
    assert sum(totals) == 15 * amount
    assert limit <= sum(totals) < limit + amount
    assert all(t > 0 for t in totals)  # every replica took part
    # All or nothing: the team key counted only what the user key let through.
    assert used == [sum(totals), sum(totals)]


async def test_a_refusal_names_the_key_and_adds_to_none(redis_url: str) -> None:
    async with books(redis_url, 1) as [(book, _, _)]:
        day = tpm("bob", window=W.DAY)
        assert isinstance(await book.reserve([LimitUse(day, 5, 5)], time.time()), Grant)
        uses = [LimitUse(tpm("bob"), 3, 100), LimitUse(day, 1, 5)]
        refusal = await book.reserve(uses, time.time())
        assert isinstance(refusal, Refusal)
        assert refusal.use == uses[1] and refusal.used == 5
        assert await book.used([tpm("bob"), day], time.time()) == [0, 5]


async def test_settlement_gives_back_the_unused_part(redis_url: str) -> None:
    async with books(redis_url, 2) as [(a, _, _), (b, _, _)]:
        uses = [LimitUse(tpm("carol"), 100, 150), LimitUse(tpm("carol", window=W.MONTH), 100, 1e6)]
        grant = await a.reserve(uses, time.time())
        assert isinstance(grant, Grant) and grant.used == (100, 100)
        grant2 = await b.reserve(uses, time.time())
        assert isinstance(grant2, Grant) and grant2.used == (200, 200)
        assert isinstance(await b.reserve(uses, time.time()), Refusal)
        await a.settle(grant, [30, 30])
        await b.settle(grant2, [0, 0])
        assert await b.used([u.key for u in uses], time.time()) == [30, 30]
        assert isinstance(await a.reserve(uses, time.time()), Grant)


async def test_the_rolling_minute_lets_go_of_each_second_sixty_seconds_on(
    redis_url: str,
) -> None:
    async with books(redis_url, 1) as [(book, _, _)]:
        key = tpm("dave")
        start = await _redis_ms(book)
        # 300 ms into a second, so the offsets below stay inside their seconds.
        book.clock_offset_ms = 1300 - start % 1000
        assert isinstance(await book.reserve([LimitUse(key, 60, 100)], 0), Grant)  # second s
        book.clock_offset_ms += 20_000
        assert isinstance(await book.reserve([LimitUse(key, 50, 100)], 0), Grant)  # s + 20
        refusal = await book.reserve([LimitUse(key, 30, 100)], 0)
        assert isinstance(refusal, Refusal) and refusal.used == 110
        # 30 fits once the first 60 left: at s + 60, about 40 s from now.
        assert 39.5 < refusal.retry_after <= 40.8
        book.clock_offset_ms += 39_000  # s + 59: still counted
        assert await book.used([key], 0) == [110]
        book.clock_offset_ms += 1_000  # s + 60: the first second's grant is out
        assert await book.used([key], 0) == [50]
        assert isinstance(await book.reserve([LimitUse(key, 30, 100)], 0), Grant)
        # The reservation deleted second s: s + 20 and s + 60 are left.
        assert await book._client.hlen(redis_key("t", key)) == 2
        book.clock_offset_ms += 60_000
        assert await book.used([key], 0) == [0]


async def test_the_retry_hint_is_when_a_reservation_is_granted_again(redis_url: str) -> None:
    # A grant needs the total below the limit, whatever the amount asked: the hint is when
    # that happens (the hint once waited for the amount to fit, 20 s late here).
    async with books(redis_url, 1) as [(book, _, _)]:
        key = tpm("erin")
        start = await _redis_ms(book)
        book.clock_offset_ms = 1300 - start % 1000
        assert isinstance(await book.reserve([LimitUse(key, 60, 100)], 0), Grant)  # second s
        book.clock_offset_ms += 20_000
        assert isinstance(await book.reserve([LimitUse(key, 50, 100)], 0), Grant)  # s + 20
        refusal = await book.reserve([LimitUse(key, 60, 100)], 0)
        assert isinstance(refusal, Refusal) and refusal.used == 110
        assert 39.5 < refusal.retry_after <= 40.8  # at s + 60 only the 50 are left
        hinted = book.clock_offset_ms + round(refusal.retry_after * 1000)
        book.clock_offset_ms = hinted - 500
        assert isinstance(await book.reserve([LimitUse(key, 60, 100)], 0), Refusal)
        book.clock_offset_ms = hinted + 100
        assert isinstance(await book.reserve([LimitUse(key, 60, 100)], 0), Grant)


def _at(when: datetime) -> float:
    return calendar.timegm(when.utctimetuple()) + when.microsecond / 1e6


@pytest.mark.parametrize(
    ("before", "window", "period_end"),
    [
        (datetime(2028, 2, 29, 23, 59, 58, 500_000, UTC), W.DAY, datetime(2028, 3, 1, tzinfo=UTC)),
        (
            datetime(2028, 2, 29, 23, 59, 58, 500_000, UTC),
            W.MONTH,
            datetime(2028, 3, 1, tzinfo=UTC),
        ),
        (
            datetime(2026, 12, 31, 23, 59, 58, 500_000, UTC),
            W.MONTH,
            datetime(2027, 1, 1, tzinfo=UTC),
        ),
        (datetime(2027, 1, 31, 12, 0, 0, 0, UTC), W.DAY, datetime(2027, 2, 1, tzinfo=UTC)),
    ],
)
async def test_calendar_periods_end_at_utc_midnight_on_redis_clock(
    redis_url: str, before: datetime, window: W, period_end: datetime
) -> None:
    async with books(redis_url, 1) as [(book, _, _)]:
        key = tpm("erin", "m", window)
        book.clock_offset_ms = round(_at(before) * 1000) - await _redis_ms(book)
        assert isinstance(await book.reserve([LimitUse(key, 10, 10)], 0), Grant)
        refusal = await book.reserve([LimitUse(key, 1, 10)], 0)
        assert isinstance(refusal, Refusal)
        expected = _at(period_end) - _at(before)
        assert expected - 0.5 < refusal.retry_after <= expected + 0.01
        book.clock_offset_ms += round(expected * 1000) + 600  # past the period's end
        assert await book.used([key], 0) == [0]
        assert isinstance(await book.reserve([LimitUse(key, 1, 10)], 0), Grant)
        assert await book._client.hlen(redis_key("t", key)) == 1  # the old period deleted


async def test_names_with_colons_unicode_or_length_never_meet(redis_url: str) -> None:
    keys = [
        tpm("a:1"),
        tpm("a", "1"),
        tpm("a", "1:"),
        tpm("a:1:", None),
        tpm("ä"),
        tpm("a"),
        tpm("1:a"),
        tpm("x" * 5000),
        tpm("x" * 4999, "x"),
        LimitKey(Scope.TEAM, "a:1", None, Measure.TOKENS, W.MINUTE),
        LimitKey(Scope.USER, "a:1", None, Measure.COST, W.MINUTE),
    ]
    assert len({redis_key("t", k) for k in keys}) == len(keys)
    async with books(redis_url, 1) as [(book, _, _)]:
        for i, key in enumerate(keys):
            assert isinstance(await book.reserve([LimitUse(key, i + 1, 1e6)], time.time()), Grant)
        assert await book.used(keys, time.time()) == [i + 1 for i in range(len(keys))]


async def test_bad_amounts_are_refused_with_the_key_named(redis_url: str) -> None:
    async with books(redis_url, 1) as [(book, _, _)]:
        with pytest.raises(ValueError, match="amount nan"):
            await book.reserve([LimitUse(tpm("f"), float("nan"), 10)], time.time())
        with pytest.raises(ValueError, match="limit 0"):
            await book.reserve([LimitUse(tpm("f"), 1, 0)], time.time())
        assert await book.used([tpm("f")], time.time()) == [0]


async def test_stored_amounts_go_into_an_empty_redis_once(redis_url: str) -> None:
    day, month = tpm("gil", window=W.DAY), tpm("gil", window=W.MONTH)
    stored = [(day, 40.0), (month, 900.0), (tpm("gil"), 5.0)]  # a rolling window: skipped
    async with books(redis_url, 2) as [(a, _, _), (b, _, _)]:
        assert isinstance(await a.reserve([LimitUse(day, 10, 100)], time.time()), Grant)
        assert await a.restore(stored) == 2  # the first replica to start
        assert await b.restore(stored) == 0  # the next: already there
        assert await b.used([day, month, tpm("gil")], time.time()) == [50, 900, 0]
        refusal = await b.reserve([LimitUse(day, 60, 50)], time.time())
        assert isinstance(refusal, Refusal) and refusal.used == 50
