"""Reading fairq's TOML file into a :class:`~fairq_server.config.schema.Config`, checked.

A file is accepted or refused as a whole, in one pass: pydantic validates every value against
its field's declaration (type, bounds; :mod:`.fields`), and what a file implies beyond its
values (backend URLs, key digests, teams, quotas, prices, JWT settings) is cross-checked here,
so that a SIGHUP reload never applies half a file. Every error names the key, in the file's
terms: ``backends[0].models: expected a list of strings, got a string ('sim')``,
``scheduler.poll_interval_seconds must be above 0, not 0``.

The plugins' options tables are checked where the plugins are built
(:func:`fairq_server.scheduling.policies.build_policies`): this package knows their names only.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from fairq_server.config.backends import check_backend_config
from fairq_server.config.console import check_allowed_hosts
from fairq_server.config.doors import parse_networks
from fairq_server.config.entitlement import check_entitlement
from fairq_server.config.fields import bare, field_info
from fairq_server.config.identity import MAX_KEY_USER_CHARS, check_jwt
from fairq_server.config.prices import check_prices
from fairq_server.config.schema import Config, ConfigError
from fairq_server.config.teams import check_teams
from fairq_server.names import MAX_NAME_CHARS, check_name

__all__ = ["describe", "load_config", "parse_config"]

_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


@functools.cache
def _adapter() -> TypeAdapter[Config]:
    # Built on first use (~0.1-0.3 s: pydantic compiles a validator for every section), not at
    # import: a command that never reads a file does not pay for it.
    return TypeAdapter(Config)


def parse_config(raw: dict[str, Any]) -> Config:
    """Build a :class:`Config` from a parsed TOML document.

    Raises:
        ConfigError: on unknown keys, missing required keys or invalid values.

    """
    raw = dict(raw)
    raw.setdefault("store", {})  # a file's store is the SQLite file unless it says otherwise
    try:
        config = _adapter().validate_python(raw)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, raw)) from None
    for name, address in (
        ("listen", config.listen),
        ("metrics_listen", config.metrics_listen),
        ("http.listen", config.http.listen),
        ("extproc.listen", config.extproc.listen),
        ("envoy.listen", config.envoy.listen),
        ("envoy.admin_listen", config.envoy.admin_listen),
    ):
        _check_address(name, address)
    for i, b in enumerate(config.backends):
        try:
            check_backend_config(b)
        except ValueError as exc:
            raise ConfigError(f"backends[{i}]: {exc}") from None
    for i, key in enumerate(config.keys):
        if not key.user or len(key.user) > MAX_KEY_USER_CHARS:
            raise ConfigError(f"keys[{i}].user must be 1-{MAX_KEY_USER_CHARS} characters")
        if _SHA256_HEX.fullmatch(key.sha256) is None:
            raise ConfigError(f"keys[{i}].sha256 must be 64 hexadecimal digits (the key's SHA-256)")
        _check_team(key.team, f"keys[{i}].team")
    served = {m for b in config.backends for m in b.models}
    try:
        for i, team in enumerate(config.teams):
            check_name(team.name, f"teams[{i}].name", MAX_NAME_CHARS)
        keyed = [(f"keys[{i}].team", k.team) for i, k in enumerate(config.keys) if k.team]
        check_teams(config.teams, keyed)
        check_prices(config.prices, served)
        check_entitlement(
            config.quotas, config.budgets, teams=[t.name for t in config.teams],
            prices=config.prices, served=served,
        )  # fmt: skip
    except ValueError as exc:  # TeamError, StoreError, EntitlementError: each names its key
        raise ConfigError(str(exc)) from None
    if config.console.enabled and not config.http.listen:
        raise ConfigError("console.enabled needs the HTTP door: set http.listen")
    try:
        check_allowed_hosts(config.console.allowed_hosts)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        parse_networks(config.http.trusted_proxies)
    except ValueError as exc:
        raise ConfigError(f"http.trusted_proxies: {exc}") from None
    if config.jwt is not None:
        try:
            check_jwt(config.jwt, [t.name for t in config.tiers])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if len(config.backends) > config.admin.max_backends:
        raise ConfigError(
            f"backends: {len(config.backends)} configured; admin.max_backends is "
            f"{config.admin.max_backends}"
        )
    return config


def _check_address(key: str, address: str) -> None:
    """Refuse a listening address that is not ``host:port`` (gRPC's ``listen`` may be ``unix:``)."""
    if not address and key != "listen":
        return  # off
    if key == "listen" and address.startswith(("unix:", "unix-abstract:")):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535 or (":" in host and "]" not in host):
        raise ConfigError(
            f'{key}: expected "host:port" with a port 0-65535 (0 picks a free one), not {address!r}'
        )


def _check_team(team: str, what: str) -> None:
    if team:  # empty: no team, the user is its own team
        try:
            check_name(team, what, MAX_NAME_CHARS)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML configuration file."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(raw)


# --- Saying what was wrong, in the file's terms --------------------------------------------

# Keys whose value is a listening address: a port alone (an integer) is the usual slip.
_ADDRESS_KEYS = frozenset({"listen", "metrics_listen"})
_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
_MISSING = ("missing", "missing_argument", "missing_keyword_only_argument")
_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")

Loc = tuple[int | str, ...]


def _explain(exc: ValidationError, raw: object) -> str:
    """Turn pydantic's first error into one sentence naming the key, as an operator reads it.

    Unknown keys come first (a typo explains the rest), then missing ones, each listed whole
    for their table; then the first other error, in the order of the file's sections.
    """
    errors = exc.errors(include_url=False)
    for kinds in (_UNKNOWN, _MISSING):
        found = [e for e in errors if e["type"] in kinds]
        if found:
            parent = found[0]["loc"][:-1]
            names = sorted(str(e["loc"][-1]) for e in found if e["loc"][:-1] == parent)
            path = _path(parent)
            if kinds is _MISSING:
                return f"{path or 'top level'}: missing required keys {names}"
            where = f"{path}: unknown keys" if path else "unknown top-level keys"
            valid = sorted(f.name for f in dataclasses.fields(_type_at(parent, table=True)[0]))
            return f"{where} {names}; valid: {valid}"
    return _one(errors[0], raw)


def _one(error: ErrorDetails, raw: object) -> str:
    loc, kind, value = error["loc"], error["type"], error["input"]
    if kind == "value_error":  # a section's own check (``__post_init__``): its message names it
        return str((error.get("ctx") or {}).get("error", error["msg"]))
    tp, info, loc = _type_at(loc)
    key = _path(loc)
    if kind == "finite_number":
        return f"{key} must be a finite number, not {value!r}"
    if kind in _BOUNDS and info is not None:
        return f"{key} {_range(info, tp, value)}, not {value!r}"
    if kind == "literal_error" and isinstance(value, str):
        choices = ", ".join(map(str, typing.get_args(tp)))
        return f"{key} {value[:64]!r} unknown; valid: {choices}"
    value = _lookup(raw, loc)
    return f"{key}: expected {_expected(tp, key)}, got {describe(value)}"


def _range(info: FieldInfo, tp: Any, value: object) -> str:
    """Say which bound ``value`` breaks, from the bounds the field declares."""
    bounds: dict[str, Any] = {}
    for m in info.metadata:
        for name in ("gt", "ge", "le", "lt"):
            if getattr(m, name, None) is not None:
                bounds[name] = getattr(m, name)
    if bounds.get("le") == 1 and (bounds.get("gt") == 0 or bounds.get("ge") == 0):
        return "is a fraction (0-1]" if "gt" in bounds else "is a fraction 0-1"
    if "le" in bounds and isinstance(value, int | float) and value > bounds["le"]:
        return f"must be at most {bounds['le']}"
    if bounds.get("gt") == 0:
        return "must be above 0"
    if bounds.get("ge") == 0:
        return "must be 0 or more"
    if "gt" in bounds:
        return f"must be above {bounds['gt']}"
    noun = "an integer" if tp is int else "a number"
    return f"must be {noun} >= {bounds.get('ge')}"


# Evaluating the annotations is most of an error's cost; the classes do not change.
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return hints


def _type_at(loc: Loc, *, table: bool = False) -> tuple[Any, FieldInfo | None, Loc]:
    """Return the declared type at ``loc``, its field's help and bounds, and the key's path.

    The path stops at a value judged whole: a list (``models = ["a", 7]`` is "a list of
    strings", not its item 1; ``tiers = ["batch"]`` is not an array of tables) or a value of
    several types (``str | tuple[str, ...]``). With ``table``, ``loc`` names a table that was
    read (an entry of an array of tables), for its keys.
    """
    tp: Any = Config
    info: FieldInfo | None = None
    for i, part in enumerate(loc):
        tp = bare(tp)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(part, str):
            tp, info = _field(tp, part)
        elif typing.get_origin(tp) is tuple and isinstance(part, int):
            item = bare(typing.get_args(tp)[0])
            if not dataclasses.is_dataclass(item) or (i == len(loc) - 1 and not table):
                return tp, info, loc[:i]  # the list is judged whole
            tp, info = item, None
        elif typing.get_origin(tp) in (Mapping, dict) and isinstance(part, str):
            tp, info = typing.get_args(tp)[1], None
        else:  # a union's member (pydantic's tag): the value is judged against the union
            return tp, info, loc[:i]
    return bare(tp), info, loc


def _field(cls: type[Any], name: str) -> tuple[Any, FieldInfo | None]:
    hint = _hints(cls)[name]
    return hint, field_info(hint)


def _expected(tp: Any, key: str) -> str:
    """Say what a value of type ``tp`` at ``key`` must look like, in the file's terms."""
    name = key.rsplit(".", 1)[-1]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [bare(a) for a in typing.get_args(tp)]
        return " or ".join(_expected(m, key) for m in members)
    if tp is str and name in _ADDRESS_KEYS:
        return 'a string "host:port" (for instance "127.0.0.1:8080")'
    if tp in _EXPECTED:
        return _EXPECTED[tp]
    if typing.get_origin(tp) is Literal:
        return "a string"
    if typing.get_origin(tp) is tuple:
        item = bare(typing.get_args(tp)[0])
        if dataclasses.is_dataclass(item):
            return f"an array of tables ([[{name}]] for each)"
        return f"a list of {_PLURAL.get(item, 'values')}"
    return "a table"


def _path(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _lookup(raw: object, loc: Loc) -> object:
    """Return the raw value at ``loc`` (what the operator wrote), for the error message."""
    for part in loc:
        items = dict(enumerate(raw)) if isinstance(raw, list) else raw
        if not isinstance(items, dict) or part not in items:
            return raw
        raw = items[part]
    return raw


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
