"""The store as one service: its engine, the usage ledger, the key store and the quota state.

:class:`Store` is what :class:`~fairq_server.doors.grpc.server.FairqServer` holds: opened (and the
schema upgraded) before the server accepts requests, closed after the last request has ended,
so the ledger's final rows are written before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from prometheus_client import CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.config.prices import PriceConfig
from fairq_server.config.store import StoreConfig, default_sqlite_path, engine_url
from fairq_server.runtime.supervisor import stop_task
from fairq_server.store.audit import AuditLog
from fairq_server.store.engine import describe, open_engine, poll_forever, upgrade
from fairq_server.store.entitlement import StoredEntitlement
from fairq_server.store.keys import LAST_USE_SECONDS, KeyStore
from fairq_server.store.ledger import Ledger
from fairq_server.store.period_counters import LimitState
from fairq_server.store.records import UsageRecord
from fairq_server.store.reports import ReportRow, last_requests, usage_report
from fairq_server.store.schema import ENTITLEMENT_VERSION, KEYS_VERSION
from fairq_server.store.series import Series, usage_series
from fairq_server.store.versions import Follower, VersionWatch

__all__ = ["Store"]

log = logging.getLogger(__name__)


class Store:
    """The usage ledger, stored keys, managed entitlement and the audit log on one database.

    Args:
        config: the ``[store]`` section.
        state_file: the configuration's ``state_file`` (the default SQLite file goes beside it).
        prices: the ``[prices]`` tables.
        tier_names: the configured tiers, in order.
        replica: this process's name, stored with each usage row.
        registry: where the ledger's metrics go.
        teams: returns the teams in force (a stored key's team must be one of them, if any).

    """

    def __init__(
        self,
        config: StoreConfig,
        state_file: str,
        prices: Mapping[str, PriceConfig],
        tier_names: Sequence[str],
        replica: str,
        registry: CollectorRegistry,
        teams: Callable[[], Collection[str]] = lambda: (),
    ) -> None:
        self.config = config
        self._teams = teams
        self._state_file = state_file
        self._prices = prices
        self._tier_names = tuple(tier_names)
        self._replica = replica
        self._registry = registry
        self._engine: AsyncEngine | None = None
        self._ledger: Ledger | None = None
        self._keys: KeyStore | None = None
        self._audit: AuditLog | None = None
        self._limits: LimitState | None = None
        self._entitlement: StoredEntitlement | None = None
        self._watch: VersionWatch | None = None
        self._uses: asyncio.Task[None] | None = None

    @property
    def described(self) -> str:
        """The database's URL, fit for a message (the password hidden)."""
        return describe(engine_url(self.config, self._state_file))

    def silent_seconds(self) -> float:
        """Return the seconds the database has left the replica's polls unanswered.

        The replica polls it every ``key_poll_seconds``: a store silent for long is down or
        hung (counted from the first unanswered ask, so a replica late to ask is not).
        """
        return self._watch.silent_seconds if self._watch is not None else 0.0

    @property
    def ledger(self) -> Ledger:
        """The usage ledger (once started)."""
        assert self._ledger is not None, "Store.start() first"
        return self._ledger

    @property
    def keys(self) -> KeyStore:
        """The key store (once started)."""
        assert self._keys is not None, "Store.start() first"
        return self._keys

    @property
    def audit(self) -> AuditLog:
        """The audit log of admins' changes (once started)."""
        assert self._audit is not None, "Store.start() first"
        return self._audit

    @property
    def limits(self) -> LimitState:
        """The quota and budget state of calendar windows (once started)."""
        assert self._limits is not None, "Store.start() first"
        return self._limits

    @property
    def entitlement(self) -> StoredEntitlement:
        """Team weights, quotas and budgets set over the Admin API (once started)."""
        assert self._entitlement is not None, "Store.start() first"
        return self._entitlement

    async def start(self) -> None:
        """Open the database, upgrade its schema, read the keys, start the ledger's writer.

        Raises:
            StoreError: the database cannot be used (one line naming ``store.url``).

        """
        engine = await open_engine(self.config, self._state_file)
        keys = KeyStore(engine, self._tier_names, self._teams)
        entitlement = StoredEntitlement(engine)
        try:
            await upgrade(engine)
            await keys.refresh()
            await entitlement.refresh()
        except BaseException:
            await engine.dispose()
            raise
        # One poll of the version counters for both (store/versions.py).
        followers: dict[str, Follower] = {KEYS_VERSION: keys, ENTITLEMENT_VERSION: entitlement}
        self._watch = VersionWatch(engine, self.config.key_poll_seconds, followers)
        self._watch.start()
        # The keys' last uses, written in one batch a minute (never per request).
        self._uses = asyncio.create_task(
            poll_forever(keys.write_uses, LAST_USE_SECONDS, _uses_unwritten), name="key-uses"
        )
        self._engine, self._keys, self._entitlement = engine, keys, entitlement
        retention = self.config.audit_retention_days * 86400
        self._audit = AuditLog(engine, self._replica, retention, self.config.audit_max_rows)
        self._ledger = Ledger(engine, self.config, self._prices, self._replica, self._registry)
        self._ledger.start()
        self._limits = LimitState(engine, self.config, self._registry)
        self._limits.start()
        if self.config.url:
            log.info("store: %s", describe(engine_url(self.config, self._state_file)))
        else:
            # The file appears unasked in the working directory (or beside state_file): say
            # where, and how to put it elsewhere.
            log.info(
                "store: no [store] url, so the usage ledger, stored keys and audit log are "
                "kept in the SQLite file %s (set [store] url to keep them elsewhere)",
                default_sqlite_path(self._state_file).resolve(),
            )

    def record(self, entry: UsageRecord) -> None:
        """Buffer one request's usage row (the request log's ``UsageSink``)."""
        if self._ledger is not None:
            self._ledger.record(entry)

    def reconfigure(self, prices: Mapping[str, PriceConfig], tier_names: Sequence[str]) -> None:
        """Apply reloaded prices and tiers (the URL and bounds need a restart)."""
        self._prices = prices
        if self._ledger is not None:
            self._ledger.set_prices(prices)
        if self._keys is not None and tuple(tier_names) != self._tier_names:
            self._keys.set_tiers(tier_names)
        self._tier_names = tuple(tier_names)

    async def report(self, by: str, since: float, until: float | None = None) -> list[ReportRow]:
        """Sum usage by team, user or model (what is buffered here is written first)."""
        assert self._engine is not None and self._ledger is not None, "Store.start() first"
        # The report says what is stored; the rest is written when the store answers.
        with contextlib.suppress(OSError):
            await self._ledger.flush()
        return await usage_report(self._engine, by, since, until)

    async def last_requests(self, users: Collection[str], since: float) -> dict[str, float]:
        """Return when each of ``users`` last had a request end, since ``since`` (flushed first)."""
        assert self._engine is not None and self._ledger is not None, "Store.start() first"
        with contextlib.suppress(OSError):
            await self._ledger.flush()
        return await last_requests(self._engine, users, since)

    async def series(self, by: str, step: str, since: float, until: float) -> Series:
        """Sum usage per hour or day and per team, user or model (flushed first, as above)."""
        assert self._engine is not None and self._ledger is not None, "Store.start() first"
        with contextlib.suppress(OSError):
            await self._ledger.flush()
        return await usage_series(self._engine, by, step, since, until)

    async def close(self) -> None:
        """Write out the ledger's buffer, stop following keys, close the connections."""
        if self._ledger is not None:
            await self._ledger.close()
        if self._limits is not None:
            await self._limits.close()
        if self._watch is not None:
            await self._watch.close()
        if self._uses is not None:
            await stop_task(self._uses)
            self._uses = None
        if self._keys is not None:
            with contextlib.suppress(OSError, SQLAlchemyError):  # the last minute's, if it can
                await self._keys.write_uses()
        if self._engine is not None:
            await self._engine.dispose()


def _uses_unwritten(error: str) -> None:
    log.warning("store: keys' last uses not written (kept for the next try): %s", error)
