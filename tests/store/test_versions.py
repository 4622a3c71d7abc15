"""One poll of the store's version counters for the key store and the stored entitlement.

Two replicas' stores on one real SQLite file: a change made through one reaches the other at
its next poll, which reads both counters in one query and reloads only what moved.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from fairq_server.config.store import StoreConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.identity.auth import hash_key
from fairq_server.store.engine import open_engine, upgrade
from fairq_server.store.entitlement import StoredEntitlement
from fairq_server.store.keys import KeyStore
from fairq_server.store.schema import ENTITLEMENT_VERSION, KEYS_VERSION
from fairq_server.store.versions import Follower, VersionWatch

TIERS = ("standard",)


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[tuple[AsyncEngine, AsyncEngine]]:
    """Two engines on one SQLite file (two replicas), the schema current."""
    config = StoreConfig(url=f"sqlite:///{tmp_path / 'fairq.db'}")
    first, second = await open_engine(config), await open_engine(config)
    await upgrade(first)
    yield first, second
    await first.dispose()
    await second.dispose()


def count_statements(engine: AsyncEngine) -> list[str]:
    """Record every statement ``engine`` sends from now on."""
    sent: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", before)
    return sent


async def followers(engine: AsyncEngine) -> tuple[KeyStore, StoredEntitlement, VersionWatch]:
    keys, entitlement = KeyStore(engine, TIERS), StoredEntitlement(engine)
    await keys.refresh()
    await entitlement.refresh()
    watched: dict[str, Follower] = {KEYS_VERSION: keys, ENTITLEMENT_VERSION: entitlement}
    return keys, entitlement, VersionWatch(engine, 0.25, watched)


async def test_a_poll_with_nothing_changed_is_one_query(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    _, _, watch = await followers(engines[0])
    sent = count_statements(engines[0])
    await watch.poll()
    assert len([s for s in sent if s.lstrip().upper().startswith("SELECT")]) == 1, sent


async def test_a_change_elsewhere_reloads_only_what_moved(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    keys, entitlement, watch = await followers(engines[0])
    other_keys = KeyStore(engines[1], TIERS)
    other_entitlement = StoredEntitlement(engines[1])
    changes: list[object] = []
    entitlement.on_change = changes.append

    await other_keys.create("ada")
    keys_before, entitlement_before = keys.version, entitlement.version
    assert not keys.has_keys()
    await watch.poll()
    assert keys.has_keys() and keys.version != keys_before
    assert entitlement.version == entitlement_before and changes == []

    await other_entitlement.set_team(TeamConfig("research", 2.0))
    await watch.poll()
    assert [t.name for t in entitlement.current.teams] == ["research"]
    assert len(changes) == 1


async def test_a_failing_reload_does_not_keep_the_other_from_its_own(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    keys, entitlement, watch = await followers(engines[0])

    async def broken() -> bool:
        raise OSError("disk gone")

    keys.refresh = broken  # type: ignore[method-assign]
    await KeyStore(engines[1], TIERS).create("ada")
    await StoredEntitlement(engines[1]).set_team(TeamConfig("research", 2.0))
    with pytest.raises(OSError, match="disk gone"):
        await watch.poll()
    assert [t.name for t in entitlement.current.teams] == ["research"]


async def test_key_uses_are_noted_in_memory_and_written_in_one_batch(
    engines: tuple[AsyncEngine, AsyncEngine],
) -> None:
    """Lookups write nothing; one batch writes every key's last use, only ever later.

    Not a key change: the other replica's poll reloads nothing for it.
    """
    here, elsewhere = KeyStore(engines[0], TIERS), KeyStore(engines[1], TIERS)
    ada, ada_secret = await here.create("ada")
    bo, _ = await here.create("bo")
    await elsewhere.refresh()
    _, _, watch = await followers(engines[1])
    sent = count_statements(engines[0])
    for _ in range(100):
        assert here.lookup(hash_key_bytes(ada_secret)) is not None
    assert sent == []  # a hundred requests, no statement
    mine = {k.id: k.last_used_at for k in await here.list()}
    assert mine[ada.id] is not None and mine[bo.id] is None  # this replica's, not written yet
    assert {k.id: k.last_used_at for k in await elsewhere.list()} == {ada.id: None, bo.id: None}
    await here.write_uses()
    assert len([s for s in sent if s.lstrip().upper().startswith("UPDATE")]) == 1, sent
    theirs = {k.id: k.last_used_at for k in await elsewhere.list()}
    assert theirs[ada.id] == pytest.approx(mine[ada.id], abs=1e-3) and theirs[bo.id] is None
    # An earlier use written later (a replica behind) leaves the later one.
    elsewhere.lookup(hash_key_bytes(ada_secret))
    elsewhere._used = {k: v - 3600 for k, v in elsewhere._used.items()}
    await elsewhere.write_uses()
    again = {k.id: k.last_used_at for k in await here.list()}
    assert again[ada.id] == pytest.approx(mine[ada.id], abs=1e-3)
    polled = count_statements(engines[1])
    await watch.poll()  # the other replica: the version did not move, nothing reloaded
    assert polled and not [s for s in polled if "api_keys" in s], polled


def hash_key_bytes(secret: str) -> bytes:
    return bytes.fromhex(hash_key(secret))


async def test_silence_counts_from_an_unanswered_poll_not_from_the_last_answer(
    tmp_path: Path,
) -> None:
    """A replica late to ask (a loaded machine) has a store that answers: silence is 0.

    Before, silence was the time since the last answer, so a replica whose polls were late
    refused Admin calls as "the store has not answered for 2 s" with the database up.
    """
    path = tmp_path / "broken.db"
    engine = await open_engine(StoreConfig(url=f"sqlite:///{path}"))
    await engine.dispose()
    path.write_bytes(b"not a database" * 100)  # every poll from now on fails
    try:
        watch = VersionWatch(engine, 0.25, {})
        assert watch.silent_seconds == 0.0  # nothing asked yet, however long ago it started
        with pytest.raises(Exception, match="not a database"):
            await watch.poll()
        first = watch.silent_seconds
        with pytest.raises(Exception, match="not a database"):
            await watch.poll()
        assert 0.0 < first < watch.silent_seconds  # from the first unanswered ask on
    finally:
        await engine.dispose()
    _, _, answering = await followers(await _fresh(tmp_path))
    await answering.poll()
    assert answering.silent_seconds == 0.0


async def _fresh(tmp_path: Path) -> AsyncEngine:
    engine = await open_engine(StoreConfig(url=f"sqlite:///{tmp_path / 'fresh.db'}"))
    await upgrade(engine)
    return engine
