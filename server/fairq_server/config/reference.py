"""The reference of every configuration key, generated from the schema: ``docs/configuration.md``.

Each key's type, default, bounds and help are declared once, on its field (:mod:`.fields`);
this renders them as one Markdown table per section, so the documentation cannot drift from
the code (``tests/unit/test_config_reference.py`` fails when the file is stale). Regenerate
with::

    uv run python -m fairq_server.config.reference > docs/configuration.md
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic.fields import FieldInfo

from fairq_server.config.fields import bare, field_info
from fairq_server.config.schema import Config

__all__ = ["keys", "render"]

_HEADER = """\
# Configuration reference

<!-- Generated from the schema (server/fairq_server/config/) by
     `uv run python -m fairq_server.config.reference > docs/configuration.md`; do not edit. -->

Every key of fairq's TOML file, with its type, default, bounds and meaning, section by
section. How the settings work together: `docs/operations.md`. A value of the wrong type, out
of its bounds, or a key not listed here is refused at start-up and at reload, naming the key.
Numbers must be finite; an integer is accepted where a number is expected. TOML has no null:
leave a key out to keep its default.
"""

_COLUMNS = "| key | type | default | bounds | meaning |\n|---|---|---|---|---|"
_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of the file, as the reference lists it."""

    table: str  # "" (top level), "scheduler", "[[tiers]]", "prices.<model>", ...
    name: str
    type: str
    default: str
    bounds: str
    help: str


def keys() -> list[Key]:
    """Return every key of the schema, section by section (top-level keys first)."""
    return list(_walk(Config, ""))


def _walk(cls: type[Any], table: str) -> Iterator[Key]:
    hints = typing.get_type_hints(cls, include_extras=True)
    nested: list[tuple[type[Any], str]] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        info = field_info(tp)
        inner = bare(tp)
        sub = _section_of(inner)
        if sub is not None:
            prefix = f"{table}." if table else ""
            if typing.get_origin(inner) is tuple:
                nested.append((sub, f"[[{prefix}{f.name}]]"))
            elif typing.get_origin(inner) in (Mapping, dict):
                nested.append((sub, f"{prefix}{f.name}.<model>"))
            else:
                nested.append((sub, f"{prefix}{f.name}"))
            continue
        yield Key(table, f.name, _type_name(inner), _default(f), _bounds(info), _help(info))
    for sub, name in nested:
        yield from _walk(sub, name)


def _section_of(tp: Any) -> type[Any] | None:
    """Return the section class ``tp`` holds (itself, an array of it, a table of it), if any."""
    candidates = [tp]
    if typing.get_origin(tp) is tuple:
        candidates = [bare(typing.get_args(tp)[0])]
    elif typing.get_origin(tp) in (Mapping, dict):
        candidates = [bare(typing.get_args(tp)[1])]
    found = candidates[0]
    return found if isinstance(found, type) and dataclasses.is_dataclass(found) else None


def _type_name(tp: Any) -> str:
    if tp in _NAMES:
        return _NAMES[tp]
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(bare(typing.get_args(tp)[0]))}s"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(bare(a)) for a in typing.get_args(tp))
    return "table"


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if value is None:
        return "unset"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        shown = [getattr(v, "name", v) for v in value]  # tiers by name
        return "`[" + ", ".join(f'"{v}"' for v in shown) + "]`" if shown else "`[]`"
    if isinstance(value, Mapping):
        return "`{}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`"


def _bounds(info: FieldInfo | None) -> str:
    if info is None:
        return ""
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    found = []
    for m in info.metadata:
        for name, sign in words.items():
            if getattr(m, name, None) is not None:
                found.append(f"{sign} {getattr(m, name)}")
    return ", ".join(found)


def _help(info: FieldInfo | None) -> str:
    text = (info.description if info is not None else None) or ""
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """Return ``docs/configuration.md``: the header, then one table per section."""
    out = [_HEADER]
    table = None
    for key in keys():
        if key.table != table:
            table = key.table
            title = (
                "Top level" if not table else f"`[{table}]`" if "[" not in table else f"`{table}`"
            )
            out.append(f"\n## {title}\n\n{_COLUMNS}")
        out.append(f"| `{key.name}` | {key.type} | {key.default} | {key.bounds} | {key.help} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
