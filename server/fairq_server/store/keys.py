"""Keys in the store: made, listed, revoked and rotated over the Admin API; read by every replica.

A key is stored only as its SHA-256 digest (as in the configuration file); the key itself is
shown once, when it is made. Each replica keeps the usable keys in memory, so authenticating
costs no database round trip, and asks the store every ``key_poll_seconds`` whether the keys'
version counter moved (one query reads it with the stored entitlement's:
:mod:`~fairq_server.store.versions`). When it did, the replica reloads the
keys; every change raises the counter in its own transaction, so a revoked key is refused on
every replica within one poll and one reload (well under a second at the default 0.25 s).

While the store cannot be read, a replica keeps the keys it last read (a revocation made
meanwhile applies once the store answers again) and logs that, at most every 10 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from fairq_server.config.identity import MAX_KEY_USER_CHARS
from fairq_server.config.teams import check_team_known
from fairq_server.errors import InvalidRequestError
from fairq_server.identity.auth import Principal, hash_key, new_key
from fairq_server.names import MAX_NAME_CHARS, check_name, escape
from fairq_server.store.schema import KEYS_VERSION, api_keys, store_versions

__all__ = ["FIRST_KEY_ADMIN", "LAST_USE_SECONDS", "KeyStore", "StoredKey"]

#: How often a replica writes its keys' last uses (one statement for every key used since).
LAST_USE_SECONDS = 60.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredKey:
    """A stored key's public description (never the key itself).

    Attributes:
        id: its public id, for revoke and rotate.
        user: the user it identifies.
        team: the team it charges (None: none).
        tiers: tiers it may use (empty: every tier).
        admin: may call the Admin service.
        created_at: Unix time it was made.
        expires_at: Unix time it stops working (None: never).
        revoked_at: Unix time it was revoked (None: not revoked).
        replaces: the id of the key it was rotated from.
        last_used_at: Unix time a replica last authenticated a request with it (None: not
            since fairq recorded it). Written every :data:`LAST_USE_SECONDS` at most, so
            another replica's use shows up to that much later.

    """

    id: str
    user: str
    team: str | None
    tiers: tuple[str, ...]
    admin: bool
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    replaces: str | None
    last_used_at: float | None = None


def _stamp(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _unix(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite returns what it stored, without the zone
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _from_row(row: Any) -> StoredKey:
    created = _unix(row.created_at)
    return StoredKey(
        id=row.id,
        user=row.user_name,
        team=row.team,
        tiers=tuple(row.tiers),
        admin=bool(row.admin),
        created_at=created or 0.0,
        expires_at=_unix(row.expires_at),
        revoked_at=_unix(row.revoked_at),
        replaces=row.replaces,
        last_used_at=_unix(row.last_used_at),
    )


#: Why a first key that is not an admin's is refused (see :meth:`KeyStore.create`).
FIRST_KEY_ADMIN = (
    "fairq runs in open mode (no keys): the first key ends it, so it must be an admin key "
    "(fairq keys create --admin; the console's Admin box), or nobody could administer fairq"
)


def _utc(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


class KeyStore:
    """The stored keys: changes through the store, lookups from memory (a ``KeySource``).

    Args:
        engine: the store's engine (its schema current).
        tier_names: the configured tiers, in order.
        teams: returns the teams in force (the file's and the ones set live); when there are
            any, a key is made only for one of them, as the file's keys and quotas are.

    """

    def __init__(
        self,
        engine: AsyncEngine,
        tier_names: Sequence[str],
        teams: Callable[[], Collection[str]] = lambda: (),
    ) -> None:
        self._engine = engine
        self._tier_names = tuple(tier_names)
        self._teams = teams
        self._version: int | None = None
        self._by_digest: dict[bytes, tuple[Principal, float | None]] = {}
        # Revoked keys' digests -> who they were: for the server's log only (a caller is
        # told "invalid API key" whatever the reason).
        self._revoked: dict[bytes, str] = {}
        self._expired: dict[bytes, str] = {}
        # Digest -> Unix time of its last lookup not yet written: at most one entry per
        # stored key, written every LAST_USE_SECONDS (write_uses), never per request.
        self._used: dict[bytes, float] = {}

    # -- KeySource ------------------------------------------------------------------------

    def has_keys(self) -> bool:
        """Return True when the store holds a key that is not revoked."""
        return bool(self._by_digest)

    def lookup(self, digest: bytes) -> Principal | None:
        """Return the principal of the unexpired, unrevoked key with SHA-256 ``digest``."""
        # A dict lookup's time depends on the digest, not on the key: it tells a caller
        # nothing it could use to find a key (that would need a SHA-256 preimage).
        found = self._by_digest.get(digest)
        if found is None:
            return None
        principal, expires_at = found
        now = time.time()
        if expires_at is not None and now >= expires_at:
            return None
        self._used[digest] = now
        return principal

    def refused(self, digest: bytes) -> str | None:
        """Say which stored key ``digest`` is and why it is refused (None: not a stored key)."""
        revoked = self._revoked.get(digest)
        if revoked is not None:
            return revoked
        found = self._by_digest.get(digest)
        if found is not None and found[1] is not None and time.time() >= found[1]:
            return self._expired.get(digest, "an expired stored key")
        return None

    # -- life -----------------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The keys' version counter at the last reload (a ``Follower`` of the store's poll)."""
        return self._version

    def set_tiers(self, tier_names: Sequence[str]) -> None:
        """Use ``tier_names`` for keys that name no tiers (configuration reload)."""
        self._tier_names = tuple(tier_names)
        self._version = None  # rebuild at the next poll

    async def refresh(self) -> bool:
        """Reload the keys if their version moved; True when it did."""
        async with self._engine.connect() as conn:
            version = await _version(conn)
            if version == self._version:
                return False
            rows = (await conn.execute(select(api_keys))).all()
        table: dict[bytes, tuple[Principal, float | None]] = {}
        revoked: dict[bytes, str] = {}
        expired: dict[bytes, str] = {}
        for row in rows:
            key = _from_row(row)
            digest = bytes.fromhex(row.sha256)
            who = f"stored key {key.id} of user '{escape(key.user, 100)}'"
            if key.revoked_at is not None:
                revoked[digest] = f"{who}, revoked at {_utc(key.revoked_at)}"
                continue
            principal = Principal(key.user, frozenset(key.tiers or self._tier_names), key.admin,
                                  team=key.team)  # fmt: skip
            table[digest] = (principal, key.expires_at)
            if key.expires_at is not None:
                expired[digest] = f"{who}, expired at {_utc(key.expires_at)}"
        self._by_digest, self._revoked, self._expired = table, revoked, expired
        self._version = version
        return True

    def unreadable(self, error: str) -> None:
        """Log that the store could not be read (the keys read last stay in force)."""
        log.warning(
            "key store unreadable, using the %d keys read last (a revocation "
            "applies once it answers): %s", len(self._by_digest), error,
        )  # fmt: skip

    # -- changes --------------------------------------------------------------------------

    def _check(self, user: str, team: str | None, tiers: Sequence[str]) -> None:
        if not user or len(user) > MAX_KEY_USER_CHARS:
            raise InvalidRequestError(f"user must be 1-{MAX_KEY_USER_CHARS} characters")
        if team is not None:
            # The rules of a file key's team: a typo would otherwise escape the team's
            # weight, quotas and budgets silently.
            try:
                check_name(team, "team", MAX_NAME_CHARS)
                check_team_known("team", team, set(self._teams()))
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
        unknown = sorted(set(tiers) - set(self._tier_names))
        if unknown:
            raise InvalidRequestError(
                f"unknown tiers {unknown}; configured: {list(self._tier_names)}"
            )

    async def create(
        self,
        user: str,
        *,
        team: str | None = None,
        tiers: Sequence[str] = (),
        admin: bool = False,
        expires_at: float | None = None,
        open_mode: bool = False,
    ) -> tuple[StoredKey, str]:
        """Make a key; return its description and the key itself (shown once).

        ``open_mode``: the server trusts every caller now (no key of any kind). The first
        key ends that, so it must be an admin's: with a user's key alone nobody could use
        the Admin API or the console's management any more.

        Raises:
            InvalidRequestError: a name out of bounds, a team that is not configured (while
                some are), an unknown tier, an expiry in the past, or a key that is not an
                admin's while ``open_mode``.

        """
        if open_mode and not admin:
            raise InvalidRequestError(FIRST_KEY_ADMIN)
        self._check(user, team, tiers)
        now = time.time()
        if expires_at is not None and expires_at <= now:
            raise InvalidRequestError("expires_at is in the past")
        async with self._engine.begin() as conn:
            key, secret = await _insert(
                conn, user, team, tuple(tiers), admin, now, expires_at, None
            )
            await _bump(conn)
        await self._refresh_quietly()
        return key, secret

    async def write_uses(self) -> None:
        """Write the last use of every key used since the last call (one transaction).

        Only ever later: a replica whose clock or batch is behind another's keeps the later
        time. Not a key change: the version counter stays (no replica reloads for it).

        Raises:
            Exception: the store could not be written (the uses are kept for the next call).

        """
        if not self._used:
            return
        used, self._used = self._used, {}
        rows = [{"digest": d.hex(), "at": _stamp(at)} for d, at in used.items()]
        column = api_keys.c.last_used_at
        statement = (
            update(api_keys)
            .where(api_keys.c.sha256 == bindparam("digest"))
            .where(or_(column.is_(None), column < bindparam("at")))
            .values(last_used_at=bindparam("at"))
        )
        try:
            async with self._engine.begin() as conn:
                await conn.execute(statement, rows)
        except BaseException:
            for digest, at in used.items():  # written next time (unless used again since)
                self._used[digest] = max(at, self._used.get(digest, at))
            raise

    async def list(self, *, include_revoked: bool = False) -> list[StoredKey]:
        """Return the stored keys, oldest first (with this replica's last uses not yet written)."""
        query = select(api_keys).order_by(api_keys.c.created_at, api_keys.c.id)
        if not include_revoked:
            query = query.where(api_keys.c.revoked_at.is_(None))
        async with self._engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        keys = []
        for row in rows:
            key = _from_row(row)
            pending = self._used.get(bytes.fromhex(row.sha256))
            if pending is not None and (key.last_used_at or 0.0) < pending:
                key = dataclasses.replace(key, last_used_at=pending)
            keys.append(key)
        return keys

    async def revoke(self, key_id: str) -> StoredKey | None:
        """Revoke key ``key_id`` on every replica; None when there is no such key."""
        async with self._engine.begin() as conn:
            row = await _get(conn, key_id)
            if row is None:
                return None
            if row.revoked_at is None:
                await conn.execute(
                    update(api_keys).where(api_keys.c.id == key_id)
                    .values(revoked_at=datetime.now(UTC))
                )  # fmt: skip
                await _bump(conn)
            row = await _get(conn, key_id)
        await self._refresh_quietly()
        return _from_row(row)

    async def rotate(self, key_id: str, grace_seconds: float = 0.0) -> tuple[StoredKey, str] | None:
        """Make a key like ``key_id``; the old one works ``grace_seconds`` more, then not.

        Returns None when there is no such key (or it is revoked).
        """
        if not 0 <= grace_seconds <= 30 * 86400:
            raise InvalidRequestError("grace_seconds must be 0-2592000 (30 days)")
        now = time.time()
        async with self._engine.begin() as conn:
            row = await _get(conn, key_id)
            if row is None or row.revoked_at is not None:
                return None
            old = _from_row(row)
            key, secret = await _insert(conn, old.user, old.team, old.tiers, old.admin, now,
                                        old.expires_at, old.id)  # fmt: skip
            change: dict[str, datetime | None] = {"revoked_at": _stamp(now)}
            if grace_seconds > 0:
                end = now + grace_seconds
                change = {"expires_at": _stamp(min(end, old.expires_at or end))}
            await conn.execute(update(api_keys).where(api_keys.c.id == key_id).values(**change))
            await _bump(conn)
        await self._refresh_quietly()
        return key, secret

    async def _refresh_quietly(self) -> None:
        """Apply a change made here at once; if the read fails, the next poll does it."""
        with contextlib.suppress(Exception):
            await self.refresh()


async def _version(conn: AsyncConnection) -> int:
    query = select(store_versions.c.version).where(store_versions.c.name == KEYS_VERSION)
    return int((await conn.execute(query)).scalar_one())


async def _bump(conn: AsyncConnection) -> None:
    await conn.execute(
        update(store_versions).where(store_versions.c.name == KEYS_VERSION)
        .values(version=store_versions.c.version + 1)
    )  # fmt: skip


async def _get(conn: AsyncConnection, key_id: str) -> Any:
    if len(key_id) > 32:
        return None
    return (await conn.execute(select(api_keys).where(api_keys.c.id == key_id))).first()


async def _insert(
    conn: AsyncConnection,
    user: str,
    team: str | None,
    tiers: tuple[str, ...],
    admin: bool,
    now: float,
    expires_at: float | None,
    replaces: str | None,
) -> tuple[StoredKey, str]:
    secret = new_key()  # the same form as a file key
    key = StoredKey(
        uuid.uuid4().hex[:16], user, team, tiers, admin, now, expires_at, None, replaces
    )
    await conn.execute(
        api_keys.insert().values(
            id=key.id, sha256=hash_key(secret), user_name=user, team=team, tiers=list(tiers),
            admin=admin, created_at=_stamp(now), expires_at=_stamp(expires_at), revoked_at=None,
            replaces=replaces,
        )
    )  # fmt: skip
    return key, secret
