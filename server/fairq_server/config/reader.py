"""One typed reader for every key of the configuration file.

TOML types its values itself, and Python would accept most of them in the wrong place: a string
where a list belongs iterates into characters (``models = "sim"`` would register ``s``, ``i``,
``m``), a table where an array of tables belongs iterates into its keys, an integer where an
address belongs fails much later, far from the file. So every value is checked against the type
its dataclass field declares before anything is built, and a mismatch is one error naming the
key: ``backends[0].models: expected a list of strings, got a string ('sim')``.

The declared types drive everything (:func:`typing.get_type_hints`), so a key added to a
configuration dataclass is read and checked without touching this module. The types a field
may declare: ``str``, ``int``, ``float``, ``bool``, ``X | None`` (TOML has no null: None is
only ever a default), ``tuple[X, ...]``, ``Mapping[str, Any]`` or ``dict[str, Any]`` (a
plugin's options table, checked by the plugin) and another configuration dataclass (a table,
or an array of tables in a tuple).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fairq_server.config.schema import ConfigError

__all__ = ["describe", "read_table"]

T = TypeVar("T")

# Called on every dataclass once built, with its key path (range checks and the like).
Check = Callable[[Any, str], None]

# Keys whose value is a listening address: a port alone (an integer) is the usual slip.
_ADDRESS_KEYS = frozenset({"listen", "metrics_listen"})


def read_table(cls: type[T], path: str, raw: object, check: Check | None = None) -> T:
    """Build the configuration dataclass ``cls`` from the TOML table ``raw``.

    Args:
        cls: a dataclass whose fields are of the types this module reads.
        path: the table's key path in the file (``""`` for the top level), used in errors.
        raw: the parsed TOML value.
        check: called with each dataclass built (this one and every nested one) and its path.

    Returns:
        The dataclass, every value of the declared type (lists become tuples).

    Raises:
        ConfigError: a value of the wrong type, an unknown key or a missing required one; the
            message names the key.

    """
    if not isinstance(raw, dict):
        header = "" if "[" in path else f" ([{path}])"
        raise ConfigError(f"{path}: expected a table{header}, got {describe(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = f"{path}: unknown keys" if path else "unknown top-level keys"
        raise ConfigError(f"{where} {unknown}; valid: {sorted(fields)}")
    missing = sorted(
        name
        for name, f in fields.items()
        if name not in raw
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"{path or 'top level'}: missing required keys {missing}")
    hints = _hints(cls)
    values = {
        name: _read(hints[name], f"{path}.{name}" if path else name, value, check)
        for name, value in raw.items()
    }
    try:
        built = cls(**values)
    except TypeError as exc:  # a field this module cannot read: a bug, said plainly anyway
        raise ConfigError(f"{path or 'top level'}: {exc}") from None
    if check is not None:
        check(built, path)
    return built


# Evaluating the annotations was most of a parse's time; the classes do not change.
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _read(tp: Any, path: str, value: object, check: Check | None) -> Any:
    tp = _strip_optional(tp)
    if tp == _ONE_OR_MORE:  # one string, or a list of them
        if isinstance(value, str) or _matches(tuple[str, ...], value):
            return value if isinstance(value, str) else tuple(typing.cast(list[str], value))
        raise ConfigError(f"{path}: expected a string or a list of strings, got {describe(value)}")
    if dataclasses.is_dataclass(tp):
        return read_table(tp, path, value, check)  # type: ignore[arg-type]
    if _matches(tp, value):
        if typing.get_origin(tp) is tuple:
            (item,) = _tuple_item(tp)
            items = typing.cast(list[object], value)
            if dataclasses.is_dataclass(item):
                return tuple(
                    read_table(item, f"{path}[{i}]", v, check)  # type: ignore[arg-type]
                    for i, v in enumerate(items)
                )
            return tuple(items)
        return dict(value) if isinstance(value, dict) else value
    expected = _expected(tp, path)
    raise ConfigError(f"{path}: expected {expected}, got {describe(value)}")


def _matches(tp: Any, value: object) -> bool:
    """Whether ``value`` (a TOML value) is of the declared type ``tp``."""
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    origin = typing.get_origin(tp)
    if origin is tuple:
        if not isinstance(value, list):
            return False
        (item,) = _tuple_item(tp)
        if dataclasses.is_dataclass(item):  # read (and named) one by one by the caller
            return all(isinstance(v, dict) for v in value)
        return all(_matches(item, v) for v in value)
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        return isinstance(value, dict)
    raise TypeError(f"a configuration field of type {tp!r} cannot be read from TOML")


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _tuple_item(tp: Any) -> tuple[Any]:
    args = typing.get_args(tp)
    if len(args) != 2 or args[1] is not Ellipsis:
        raise TypeError(f"a configuration tuple must be tuple[X, ...], not {tp!r}")
    return (args[0],)


# ``str | tuple[str, ...]``: a setting given as one string or a list of strings.
_ONE_OR_MORE: Any = str | tuple[str, ...]

_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _expected(tp: Any, path: str) -> str:
    """Say what a value of type ``tp`` at ``path`` must look like, in the file's terms."""
    name = path.rsplit(".", 1)[-1]
    if tp is str and name in _ADDRESS_KEYS:
        return 'a string "host:port" (for instance "127.0.0.1:8080")'
    if tp in _EXPECTED:
        return _EXPECTED[tp]
    if typing.get_origin(tp) is tuple:
        (item,) = _tuple_item(tp)
        if dataclasses.is_dataclass(item):
            return f"an array of tables ([[{name}]] for each)"
        return f"a list of {_PLURAL.get(item, 'values')}"
    return "a table"


def describe(value: object) -> str:
    """Name a TOML value's type for an error message, with the value itself when short."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return "an array of tables"
        return "a list"
    kind = {int: "an integer", float: "a number", str: "a string"}.get(type(value), "a date/time")
    shown = repr(value)
    return f"{kind} ({shown[:60]}{'...' if len(shown) > 60 else ''})"
