"""``fairq db upgrade | current``: the store's schema (``fairq serve`` upgrades it too).

``upgrade`` brings the database ``[store]`` names to the schema this fairq ships, then exits:
for operators who migrate before rolling a new release out. ``current`` prints the database's
revision and the newest this fairq knows.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from fairq_server.config.loader import load_config
from fairq_server.config.schema import ConfigError
from fairq_server.config.store import StoreConfig
from fairq_server.store.engine import current_revision, head_revision, open_engine, upgrade

__all__ = ["main"]


async def _run(action: str, store: StoreConfig, state_file: str) -> str:
    engine = await open_engine(store, state_file)
    try:
        if action == "upgrade":
            await upgrade(engine)
        return (
            f"database at {await current_revision(engine)}; this fairq's newest: {head_revision()}"
        )
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Run ``fairq db``."""
    parser = argparse.ArgumentParser(
        prog="fairq db",
        description="The store's schema (fairq serve upgrades it too). upgrade brings the "
        "database [store] names to this fairq's schema, then exits (to migrate before "
        "rolling a release out); current prints the database's revision and the newest "
        "this fairq knows.",
    )
    parser.add_argument("action", choices=("upgrade", "current"))
    parser.add_argument("--config", required=True, help="TOML configuration file")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        assert config.store is not None  # a file always has one (the default SQLite file)
        print(asyncio.run(_run(args.action, config.store, config.state_file)))
    except (OSError, ConfigError, ValueError) as exc:
        print(f"fairq db: {exc}", file=sys.stderr)
        return 2
    return 0
