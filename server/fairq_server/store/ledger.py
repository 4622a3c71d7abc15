"""The usage ledger's writer: rows buffered in memory, written in batches by one task.

The request path only appends to a bounded buffer (:meth:`Ledger.record`, no I/O, no wait);
one task writes up to ``batch_rows`` rows per transaction, at once when a batch is full and at
the latest ``flush_seconds`` after a row arrived. When the database fails, the rows stay at the
head of the buffer and the batch is retried with a growing pause (up to
:data:`MAX_RETRY_SECONDS`); the failure is counted and logged at most once per
:data:`LOG_INTERVAL_SECONDS`. A row that finds the buffer full is dropped and counted. On stop
the buffer is written out (for at most ``stop_flush_seconds``). Each row carries an id made
here, and inserts skip an id already stored, so a batch whose commit was acknowledged too late
to be seen is not written twice by its retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.config.prices import PriceConfig
from fairq_server.config.store import StoreConfig
from fairq_server.runtime.log_throttle import Throttled
from fairq_server.runtime.supervisor import OwnedTask, stop_asked
from fairq_server.store.engine import short_error
from fairq_server.store.records import UsageRecord
from fairq_server.store.schema import usage

__all__ = ["LOG_INTERVAL_SECONDS", "MAX_RETRY_SECONDS", "Ledger", "LedgerMetrics"]

log = logging.getLogger(__name__)

LOG_INTERVAL_SECONDS = 10.0
MAX_RETRY_SECONDS = 5.0
_FIRST_RETRY_SECONDS = 0.25


class LedgerMetrics:
    """The ledger's Prometheus series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.written = Counter(
            "fairq_ledger_rows_written", "Usage rows written to the store.", registry=registry
        )
        self.pending = Gauge(
            "fairq_ledger_rows_pending",
            "Usage rows held in memory, not yet written (the buffer).",
            registry=registry,
        )
        self.write_errors = Counter(
            "fairq_ledger_write_errors",
            "Batch writes that failed (the database down or refusing); their rows stay "
            "buffered and are retried.",
            registry=registry,
        )
        self.rows_unwritten = Counter(
            "fairq_ledger_rows_unwritten",
            "Rows in failed batch writes, once per failed attempt (each is retried).",
            registry=registry,
        )
        self.dropped = Counter(
            "fairq_ledger_rows_dropped",
            "Usage rows lost: the buffer was full (store.buffer_rows), or the store was still "
            "unwritable when fairq stopped.",
            ["reason"],
            registry=registry,
        )


class Ledger:
    """Buffers usage rows and writes them to ``engine`` in batches.

    Args:
        engine: the store's engine (its schema current).
        config: buffer and batch bounds.
        prices: per-model prices; a model without one gets a null cost.
        replica: this process's name, stored with each row.
        registry: where the metrics go.

    """

    def __init__(
        self,
        engine: AsyncEngine,
        config: StoreConfig,
        prices: Mapping[str, PriceConfig],
        replica: str,
        registry: CollectorRegistry,
    ) -> None:
        self._engine = engine
        self._config = config
        self._prices = dict(prices)
        self._replica = replica
        self.metrics = LedgerMetrics(registry)
        self._buffer: deque[dict[str, Any]] = deque()
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()
        self._writer = OwnedTask("usage-ledger")
        self._failures = Throttled(LOG_INTERVAL_SECONDS, log)
        self._overflow = Throttled(LOG_INTERVAL_SECONDS, log)
        self._failing_since: float | None = None  # monotonic time of the first failed write
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        self._insert = dialect.insert(usage).on_conflict_do_nothing(index_elements=["id"])

    @property
    def pending(self) -> int:
        """Rows buffered, not yet written."""
        return len(self._buffer)

    def set_prices(self, prices: Mapping[str, PriceConfig]) -> None:
        """Price rows recorded from now on with ``prices`` (configuration reload)."""
        self._prices = dict(prices)

    def record(self, entry: UsageRecord) -> None:
        """Buffer one request's row; never blocks, never raises for the database's sake."""
        if len(self._buffer) >= self._config.buffer_rows:
            self.metrics.dropped.labels("buffer_full").inc()
            self._overflow.warning(
                "usage ledger buffer full (store.buffer_rows = %d): a row was dropped",
                self._config.buffer_rows,
            )
            return
        price = self._prices.get(entry.model)
        cost = None if price is None else price.cost(entry.input_tokens, entry.output_tokens)
        self._buffer.append(
            {
                "id": uuid.uuid4().hex,
                "ended_at": datetime.fromtimestamp(entry.ended_at, UTC),
                "request_id": entry.request_id,
                "user_name": entry.user,
                "team": entry.team,
                "model": entry.model,
                "backend": entry.backend,
                "tier": entry.tier,
                "input_tokens": entry.input_tokens,
                "output_tokens": entry.output_tokens,
                "cost": cost,
                "queue_seconds": entry.queue_seconds,
                "ttft_seconds": entry.ttft_seconds,
                "outcome": entry.outcome,
                "replica": self._replica,
            }
        )
        self.metrics.pending.set(len(self._buffer))
        if len(self._buffer) >= self._config.batch_rows:
            self._wake.set()

    def start(self) -> None:
        """Start the writer task."""
        self._writer.start(self._run)

    async def close(self) -> None:
        """Stop the writer and write out what is buffered (within ``stop_flush_seconds``)."""
        await self._writer.stop()
        deadline = time.monotonic() + self._config.stop_flush_seconds
        pause = _FIRST_RETRY_SECONDS
        while self._buffer and time.monotonic() < deadline:
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.01)):
                    if not await self._write_batch():
                        await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0)))
                        pause = min(pause * 2, MAX_RETRY_SECONDS)
            except TimeoutError:
                break
        if self._buffer:
            lost = len(self._buffer)
            self.metrics.dropped.labels("stopped").inc(lost)
            log.error("usage ledger: %d rows could not be written before stopping; lost", lost)
            self._buffer.clear()
            self.metrics.pending.set(0)

    async def flush(self) -> None:
        """Write everything buffered now (tests, reports that must see the latest rows).

        Raises:
            OSError: a write failed (the rows stay buffered).

        """
        while self._buffer:
            if not await self._write_batch():
                raise OSError("usage ledger: the store did not accept the rows")

    async def _run(self) -> None:
        pause = _FIRST_RETRY_SECONDS
        while not stop_asked():
            # asyncio.timeout, not wait_for: on 3.11 wait_for can lose a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.flush_seconds):
                    await self._wake.wait()
            self._wake.clear()
            while self._buffer:
                if await self._write_batch():
                    pause = _FIRST_RETRY_SECONDS
                    if len(self._buffer) < self._config.batch_rows:
                        break  # a part batch: wait for more rows or the flush interval
                else:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, MAX_RETRY_SECONDS)

    async def _write_batch(self) -> bool:
        """Write the buffer's first batch; True when it is stored (and taken off the buffer)."""
        # One batch at a time: flush() (a report) may run beside the writer task, and both
        # would otherwise take the same first rows.
        async with self._writing:
            return await self._write_first()

    async def _write_first(self) -> bool:
        rows = list(islice(self._buffer, self._config.batch_rows))
        if not rows:
            return True
        try:
            async with self._engine.begin() as conn:
                await conn.execute(self._insert, rows)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
            self.metrics.write_errors.inc()
            self.metrics.rows_unwritten.inc(len(rows))
            self._failures.warning(
                "usage ledger: writing %d rows failed, kept (%d buffered) and retried: %s",
                len(rows), len(self._buffer), short_error(exc),
            )  # fmt: skip
            return False
        # Rows are only ever appended at the right, so the first len(rows) are these.
        for _ in rows:
            self._buffer.popleft()
        if self._failing_since is not None:  # the failures were logged: say they ended
            log.info(
                "usage ledger: writes go through again after %.1f s of failures (%d rows "
                "still buffered)", time.monotonic() - self._failing_since, len(self._buffer),
            )  # fmt: skip
            self._failing_since = None
        self.metrics.written.inc(len(rows))
        self.metrics.pending.set(len(self._buffer))
        return True
