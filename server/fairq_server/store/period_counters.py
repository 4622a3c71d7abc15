"""Quota and budget state that outlives a restart: calendar counters per period, in the store.

A rolling minute need not outlive a restart (it is gone a minute later), but a day's or a
month's budget must: a restart must not hand it back. So every settlement of a calendar
window's counter is also summed here (:meth:`LimitState.add`: memory only, no I/O, never
blocks) and written by one task, at most every ``flush_seconds``, as increments: an upsert
adds to the stored amount, so replicas sharing one PostgreSQL add up. When the database fails,
the sums stay in memory (added to what arrives meanwhile), the failure is counted and logged
at most every :data:`~fairq_server.store.ledger.LOG_INTERVAL_SECONDS`, and the write is
retried with a growing pause. At start :meth:`LimitState.load` reads back the current day's
and month's amounts, for the book to count from. A write whose commit succeeded but whose
acknowledgement was lost is added again by its retry: the cautious side for a budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.config.store import StoreConfig
from fairq_server.runtime.log_throttle import Throttled
from fairq_server.runtime.supervisor import OwnedTask, stop_asked
from fairq_server.store.engine import short_error
from fairq_server.store.ledger import LOG_INTERVAL_SECONDS, MAX_RETRY_SECONDS
from fairq_server.store.schema import limit_usage

__all__ = ["CounterName", "LimitState", "key_id", "period_of"]

#: A counter by its fields, as stored: scope, subject, model (None: every model), measure, window
#: (``day`` or ``month``). The limit book's keys, without importing the book (which imports the
#: store's price settings).
CounterName = tuple[str, str, str | None, str, str]

log = logging.getLogger(__name__)

_FIRST_RETRY_SECONDS = 0.25


def period_of(window: str, when: float) -> str | None:
    """Return the UTC period of ``window`` that ``when`` falls in (None: not day or month)."""
    if window not in ("day", "month"):
        return None
    day = datetime.fromtimestamp(when, UTC)
    return day.strftime("d%Y-%m-%d") if window == "day" else day.strftime("M%Y-%m")


def key_id(name: CounterName) -> str:
    """Return a digest naming a counter (a bounded primary key for any subject or model)."""
    return hashlib.sha256(json.dumps(list(name), ensure_ascii=False).encode()).hexdigest()


class LimitState:
    """Sums settled calendar amounts and writes them to ``engine`` in the background.

    Args:
        engine: the store's engine (its schema current).
        config: the flush interval; ``buffer_rows`` bounds the counters held unwritten.
        registry: where the metrics go.

    """

    def __init__(
        self, engine: AsyncEngine, config: StoreConfig, registry: CollectorRegistry
    ) -> None:
        self._engine = engine
        self._config = config
        self._pending: dict[tuple[CounterName, str], float] = {}
        self._writing = asyncio.Lock()
        self._writer = OwnedTask("limit-state")
        self._failures = Throttled(LOG_INTERVAL_SECONDS, log)
        self._overflow = Throttled(LOG_INTERVAL_SECONDS, log)
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        insert = dialect.insert(limit_usage)
        self._upsert = insert.on_conflict_do_update(
            index_elements=["key_id", "period"],
            set_={
                "amount": limit_usage.c.amount + insert.excluded.amount,
                "updated_at": insert.excluded.updated_at,
            },
        )
        self.pending_gauge = Gauge(
            "fairq_limit_state_pending",
            "Quota and budget counters (per period) settled but not yet written to the store.",
            registry=registry,
        )
        self.write_errors = Counter(
            "fairq_limit_state_write_errors",
            "Writes of quota and budget state that failed (kept in memory and retried).",
            registry=registry,
        )
        self.dropped = Counter(
            "fairq_limit_state_dropped",
            "Settled amounts not kept for the store: too many counters unwritten "
            "(store.buffer_rows), or the store still unwritable when fairq stopped.",
            ["reason"],
            registry=registry,
        )

    @property
    def pending(self) -> int:
        """Counters (per period) held, not yet written (a batch being written is not held)."""
        return len(self._pending)

    @property
    def stored(self) -> bool:
        """Whether everything added is in the store: nothing held, no write in flight."""
        return not self._pending and not self._writing.locked()

    def add(self, name: CounterName, when: float, amount: float) -> None:
        """Count ``amount`` settled on counter ``name`` at ``when`` (rolling windows: ignored)."""
        period = period_of(name[4], when)
        if period is None or amount == 0:
            return
        slot = (name, period)
        if slot not in self._pending and len(self._pending) >= self._config.buffer_rows:
            self.dropped.labels("buffer_full").inc()
            self._overflow.warning(
                "quota state: %d counters unwritten (store.buffer_rows): an amount was dropped",
                len(self._pending),
            )
            return
        self._pending[slot] = self._pending.get(slot, 0.0) + amount
        self.pending_gauge.set(len(self._pending))

    def start(self) -> None:
        """Start the writer task."""
        self._writer.start(self._run)

    async def close(self) -> None:
        """Stop the writer and write what is held (within ``stop_flush_seconds``)."""
        # A write in flight ends first: cancelled after its commit, its amounts would be put
        # back and written again here (counted twice). A write that hangs longer is cancelled.
        held = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._config.stop_flush_seconds):
                await self._writing.acquire()
                held = True
        try:
            await self._writer.stop()
        finally:
            if held:
                self._writing.release()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._config.stop_flush_seconds):
                pause = _FIRST_RETRY_SECONDS
                while self._pending and not await self._write():
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, MAX_RETRY_SECONDS)
        if self._pending:
            self.dropped.labels("stopped").inc(len(self._pending))
            log.error("quota state: %d counters could not be written before stopping; lost",
                      len(self._pending))  # fmt: skip
            self._pending.clear()
            self.pending_gauge.set(0)

    async def flush(self) -> None:
        """Write everything held now.

        Raises:
            OSError: the write failed (the amounts stay held).

        """
        if not await self._write():
            raise OSError("quota state: the store did not accept the amounts")

    async def load(self, now: float) -> list[tuple[CounterName, float]]:
        """Read the current day's and month's stored amounts (UTC), for the book at start."""
        periods = [period_of("day", now), period_of("month", now)]
        c = limit_usage.c
        query = select(c.scope, c.subject, c.model, c.measure, c.limit_window, c.amount, c.period)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query.where(c.period.in_(periods)))).all()
        return [
            ((scope, subject, model, measure, window), float(amount))
            for scope, subject, model, measure, window, amount, period in rows
            if period_of(window, now) == period
        ]

    async def _run(self) -> None:
        pause, retry = self._config.flush_seconds, _FIRST_RETRY_SECONDS
        while not stop_asked():
            await asyncio.sleep(pause)
            if await self._write():
                pause, retry = self._config.flush_seconds, _FIRST_RETRY_SECONDS
            else:
                pause, retry = retry, min(retry * 2, MAX_RETRY_SECONDS)

    def _put_back(self, batch: dict[tuple[CounterName, str], float]) -> None:
        for slot, amount in batch.items():  # added to what came meanwhile
            self._pending[slot] = self._pending.get(slot, 0.0) + amount
        self.pending_gauge.set(len(self._pending))

    async def _write(self) -> bool:
        """Write what is held; True when stored (or nothing was held)."""
        async with self._writing:
            if not self._pending:
                return True
            batch, self._pending = self._pending, {}
            stamp = datetime.fromtimestamp(time.time(), UTC)
            rows = [
                {
                    "key_id": key_id(name), "period": period, "scope": name[0],
                    "subject": name[1], "model": name[2], "measure": name[3],
                    "limit_window": name[4], "amount": amount, "updated_at": stamp,
                }
                for (name, period), amount in batch.items()
            ]  # fmt: skip
            try:
                async with self._engine.begin() as conn:
                    await conn.execute(self._upsert, rows)
            except asyncio.CancelledError:
                self._put_back(batch)  # stopping: close() writes it
                raise
            except Exception as exc:
                self._put_back(batch)
                self.write_errors.inc()
                self._failures.warning(
                    "quota state: writing %d counters failed, kept and retried: %s",
                    len(rows), short_error(exc),
                )  # fmt: skip
                return False
            self.pending_gauge.set(len(self._pending))
            return True
