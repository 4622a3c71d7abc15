"""Opening the store's database and bringing its schema up to date (Alembic).

``fairq serve`` upgrades the schema when it starts (and ``fairq db upgrade`` does only that),
so a new release's tables exist before the first request. Replicas sharing a PostgreSQL may
start together: the upgrade runs under a transaction-scoped advisory lock, so one of them
migrates and the others find the schema current.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, event, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fairq_server.config.store import StoreConfig, StoreError, engine_url
from fairq_server.runtime.supervisor import stop_asked

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

__all__ = [
    "MIGRATIONS",
    "current_revision",
    "describe",
    "head_revision",
    "open_engine",
    "short_error",
    "unreachable",
    "upgrade",
]

MIGRATIONS = Path(__file__).parent / "migrations"
# Any constant shared by every fairq: the key of the advisory lock migrations run under.
_MIGRATION_LOCK = 0x66616972_71_01


def describe(url: str) -> str:
    """Return ``url`` fit for a log line or an error (the password hidden)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable url>"


async def open_engine(config: StoreConfig, state_file: str = "") -> AsyncEngine:
    """Create the engine ``config`` names and check that the database answers.

    Raises:
        StoreError: the URL is unusable or the database cannot be reached (one line, naming
            ``store.url``).

    """
    url = engine_url(config, state_file)
    parsed = make_url(url)
    timeout = config.connect_timeout_seconds
    if parsed.get_backend_name() == "sqlite":
        folder = Path(parsed.database or "").parent
        if parsed.database and not folder.is_dir():
            raise StoreError(f"store.url: folder {str(folder)!r} of the SQLite file does not exist")
        engine = create_async_engine(url, connect_args={"timeout": timeout})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    else:
        engine = create_async_engine(
            url,
            # A restarted server leaves dead pooled connections: test each before use.
            pool_pre_ping=True,
            pool_size=4,
            max_overflow=2,
            pool_timeout=timeout,
            connect_args={"timeout": timeout, "command_timeout": max(timeout, 30.0)},
        )
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:
        await engine.dispose()
        raise StoreError(
            f"store.url: cannot use the database {describe(url)}: {short_error(exc)}"
        ) from None
    return engine


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    # WAL lets `fairq usage` read while the server writes; busy_timeout waits out the
    # writer's lock instead of failing at once.
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def short_error(exc: BaseException) -> str:
    """Return the first line of ``exc``'s message, bounded."""
    message = str(exc).strip().splitlines()
    first = message[0] if message else type(exc).__name__
    return first[:300]


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or dropped the connection.

    As opposed to a refusal of what was asked (a constraint, bad input): the caller's request
    was fine and may succeed later, so it is an outage (UNAVAILABLE / 503), not a bad request.
    OSError covers a refused or failed connect and timeouts (TimeoutError is one); SQLAlchemy's
    OperationalError and InterfaceError the DBAPI's own (a server shutting down, a connection
    lost mid-query); asyncpg raises its own unwrapped at connect (the server starting or
    shutting down, too many connections).
    """
    from asyncpg.exceptions import (  # type: ignore[import-untyped]  # asyncpg ships no types
        InsufficientResourcesError,
        OperatorInterventionError,
        PostgresConnectionError,
    )
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    outage = (
        OSError, OperationalError, InterfaceError, PostgresConnectionError,
        OperatorInterventionError, InsufficientResourcesError,
    )  # fmt: skip
    if isinstance(exc, outage):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


# Alembic is imported where it is used: it is most of the store's import time, and a
# process needs it once, at start.


def _alembic_config(conn: Connection | None) -> AlembicConfig:
    # Alembic logs a line per plugin it sets up and per migration context at INFO: not worth
    # an operator's attention (fairq logs the store it opened and the revisions it applied).
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


def _upgrade(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
    else:
        # SQLite's driver opens a transaction only before data changes, not before DDL: take
        # the write lock first, so a second process starting on the same file waits for this
        # upgrade (busy_timeout) and then finds the schema current.
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    from alembic import command

    command.upgrade(_alembic_config(conn), "head")


async def upgrade(engine: AsyncEngine) -> None:
    """Bring the schema to the newest revision (a no-op when it is current).

    Raises:
        StoreError: the migration failed (naming ``store.url``).

    """
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_upgrade)
    except StoreError:
        raise
    except Exception as exc:
        raise StoreError(f"store.url: schema upgrade failed: {short_error(exc)}") from None


def head_revision() -> str:
    """Return the newest revision the shipped migrations know."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config(None)).get_current_head()
    assert head is not None
    return head


async def current_revision(engine: AsyncEngine) -> str | None:
    """Return the database's revision (None before the first upgrade)."""
    from alembic.runtime.migration import MigrationContext

    def read(conn: Connection) -> str | None:
        return MigrationContext.configure(conn).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


#: Seconds between two warnings of one poller whose database stays unreadable.
POLL_LOG_SECONDS = 10.0


async def poll_forever(
    refresh: Callable[[], Awaitable[object]], seconds: float, unreadable: Callable[[str], None]
) -> None:
    """Call ``refresh`` every ``seconds`` until cancelled; a failure is reported, then retried.

    ``unreadable`` gets the short error at most once every :data:`POLL_LOG_SECONDS`: a
    database that stays away writes one line per interval, not one per poll.
    """
    last = -math.inf
    while not stop_asked():
        await asyncio.sleep(seconds)
        try:
            await refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            now = time.monotonic()
            if now - last >= POLL_LOG_SECONDS:
                last = now
                unreadable(short_error(exc))
