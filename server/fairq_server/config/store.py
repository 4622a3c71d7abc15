"""The ``[store]`` section: where usage and keys are kept (prices: :mod:`.prices`).

Example::

    [store]
    url = "postgresql://fairq@db.internal/fairq"   # default: a SQLite file, no server
    password_env = "FAIRQ_DB_PASSWORD"
    batch_rows = 500
    buffer_rows = 100000
    flush_seconds = 1.0
    key_poll_seconds = 0.25
    audit_retention_days = 90
    audit_max_rows = 100000

No ``[store]`` section: the usage ledger and the key store are a SQLite file beside
``state_file`` (or ``fairq.db`` in the working directory), so one process needs no database
server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

from fairq_server.config.fields import Float, Int, Str, doc, section

__all__ = [
    "DEFAULT_SQLITE_NAME",
    "StoreConfig",
    "StoreError",
    "default_sqlite_path",
    "engine_url",
]

DEFAULT_SQLITE_NAME = "fairq.db"
# The drivers fairq ships for each scheme an operator may write.
_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


class StoreError(ValueError):
    """The store's settings are invalid; the message names the key."""


@section
@dataclass(frozen=True)
class StoreConfig:
    """Where the usage ledger and the stored keys live."""

    url: Annotated[
        Str,
        doc(
            "``sqlite:///path/file.db`` or ``postgresql://user@host:5432/db`` (empty: a SQLite "
            "file beside ``state_file``, else ``fairq.db`` in the working directory)"
        ),
    ] = ""
    password_env: Annotated[
        Str, doc("environment variable holding the database password (overrides the URL's)")
    ] = ""
    batch_rows: Annotated[Int, doc("most usage rows written in one transaction", ge=1)] = 500
    buffer_rows: Annotated[
        Int,
        doc(
            "most rows held in memory while the database is slow or down; a row finished "
            "beyond that is dropped and counted (``fairq_ledger_rows_dropped_total``)",
            ge=1,
        ),
    ] = 100_000
    flush_seconds: Annotated[
        Float, doc("longest a finished request's row waits before it is written", gt=0)
    ] = 1.0
    key_poll_seconds: Annotated[
        Float,
        doc(
            "how often a replica asks the store whether keys changed (a revoked key is refused "
            "everywhere within this and one read)",
            gt=0,
        ),
    ] = 0.25
    stop_flush_seconds: Annotated[
        Float, doc("how long a stopping fairq keeps trying to write what it holds", gt=0)
    ] = 10.0
    connect_timeout_seconds: Annotated[Float, doc("bound on opening a connection", gt=0)] = 5.0
    audit_retention_days: Annotated[
        Float, doc("how long the audit log keeps a change (console and Admin API)", gt=0)
    ] = 90.0
    audit_max_rows: Annotated[
        Int, doc("most rows the audit log keeps (the oldest go first)", ge=1)
    ] = 100_000

    def __post_init__(self) -> None:
        if self.url:
            scheme = self.url.partition(":")[0].lower()
            if scheme not in _DRIVERS or "://" not in self.url:
                raise StoreError(
                    f"store.url must start with sqlite:/// or postgresql://, not {self.url!r}"
                )


def default_sqlite_path(state_file: str = "") -> Path:
    """Return the SQLite file a store without ``url`` uses: beside ``state_file``, else here.

    Relative to the working directory when ``state_file`` is (as the engine opens it).
    """
    folder = Path(state_file).parent if state_file else Path()
    return folder / DEFAULT_SQLITE_NAME


def engine_url(config: StoreConfig, state_file: str = "") -> str:
    """Return the SQLAlchemy URL (with its async driver) that ``config`` names.

    Raises:
        StoreError: ``password_env`` names an unset variable.

    """
    url = config.url
    if not url:
        url = f"sqlite:///{default_sqlite_path(state_file)}"
    scheme, _, rest = url.partition("://")
    driver = _DRIVERS[scheme.lower()]
    if config.password_env:
        password = os.environ.get(config.password_env)
        if password is None:
            raise StoreError(f"store.password_env: {config.password_env} is not set")
        userinfo, at, hostpart = rest.rpartition("@")
        if not at:
            raise StoreError("store.password_env needs a user in store.url (user@host)")
        user = userinfo.partition(":")[0]
        rest = f"{user}:{quote(password, safe='')}@{hostpart}"
    return f"{driver}://{rest}"
