"""The documentation of the configuration is the schema's: generated from it, and fresh."""

from __future__ import annotations

import re
from pathlib import Path

from fairq_server.config.reference import keys, render

DOCS = Path(__file__).parents[2] / "docs"


def test_the_reference_is_generated_from_the_schema_and_fresh() -> None:
    written = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert written == render(), (
        "docs/configuration.md is stale: uv run python -m fairq_server.config.reference "
        "> docs/configuration.md"
    )


def test_every_key_has_its_default_and_help() -> None:
    listed = keys()
    assert len(listed) > 150
    assert all(k.default and k.help for k in listed), [k.name for k in listed if not k.help]
    scheduler = {k.name: k for k in listed if k.table == "scheduler"}
    assert scheduler["poll_interval_seconds"].default == "`0.5`"
    assert scheduler["poll_interval_seconds"].bounds == "> 0"
    assert {k.table for k in listed} >= {"", "scheduler", "[[tiers]]", "prices.<model>", "jwt"}


def test_the_operators_guide_names_only_keys_of_the_schema() -> None:
    """``docs/operations.md``'s overview table names keys as ``section.key``: each exists."""
    known = {f"{k.table}.{k.name}".strip(".").replace("[[", "").replace("]]", "") for k in keys()}
    known |= {k.name for k in keys() if not k.table}
    guide = (DOCS / "operations.md").read_text(encoding="utf-8")
    table = guide[guide.index("| key | default | meaning |") :].split("\n\n", 1)[0]
    named = set(re.findall(r"^\| `([a-z_.]+)`", table, flags=re.MULTILINE))
    assert len(named) > 20
    assert sorted(named - known) == []
