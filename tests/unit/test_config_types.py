"""Every key of the configuration file given a value of the wrong type: one clear error naming
the key, never a traceback, never a value iterated into characters."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fairq_server.config.loader import load_config, parse_config
from fairq_server.config.schema import Config, ConfigError

# The smallest valid content of the sections that have required keys, so that the one wrong
# value in each case is the only thing wrong.
_VALID_ITEM: dict[str, dict[str, object]] = {
    "backends": {"id": "b", "kind": "vllm", "base_url": "http://127.0.0.1:1", "models": ["m"]},
    "keys": {"user": "u", "sha256": "0" * 64},
    "tiers": {"name": "t"},
    "teams": {"name": "t"},
    "cluster": {"redis_url": "redis://127.0.0.1:1"},
    "tls": {"cert_file": "c.pem", "key_file": "k.pem"},
}

# A wrong value for each declared type, and what the error must say was expected.
_SCALARS: dict[Any, tuple[object, str]] = {
    str: (12345, "expected a string"),
    int: ("12", "expected an integer"),
    float: ("1.5", "expected a number"),
    bool: ("yes", "expected true or false"),
}


def _strip_optional(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(tp) and len(args) == 1 else tp


def _wrong(tp: Any) -> tuple[object, str]:
    """A value of the wrong type for ``tp`` and the start of the expected error text."""
    tp = _strip_optional(tp)
    if tp in _SCALARS:
        return _SCALARS[tp]
    if typing.get_origin(tp) is typing.Literal:  # a closed set of names (plugins)
        return _SCALARS[str]
    if tp == str | tuple[str, ...]:  # one string or a list of them
        return 12, "expected a string or a list of strings"
    if typing.get_origin(tp) is tuple:
        (item, _) = typing.get_args(tp)
        if dataclasses.is_dataclass(item):
            return {"a": 1}, "expected an array of tables"  # [x] written for [[x]]
        return "sim", "expected a list of strings"  # a string iterates into characters
    if typing.get_origin(tp) in (Mapping, dict) or dataclasses.is_dataclass(tp):
        return "x", "expected a table"
    raise AssertionError(f"no wrong value for {tp!r}: extend this test")


def _cases() -> Iterator[tuple[str, dict[str, object], str]]:
    """(key path, raw document, expected text) for every key of every section."""
    for name, tp in typing.get_type_hints(Config).items():
        value, expected = _wrong(tp)
        yield name, {name: value}, expected
        inner = _strip_optional(tp)
        is_array = typing.get_origin(inner) is tuple
        section = typing.get_args(inner)[0] if is_array else inner
        if not dataclasses.is_dataclass(section):
            continue
        for key, key_tp in typing.get_type_hints(section).items():
            value, expected = _wrong(key_tp)
            table = {**_VALID_ITEM.get(name, {}), key: value}
            if is_array:
                yield f"{name}[0].{key}", {name: [table]}, expected
            else:
                yield f"{name}.{key}", {name: table}, expected


CASES = list(_cases())


def test_the_table_covers_every_key_of_every_section() -> None:
    paths = {path for path, _, _ in CASES}
    assert {"listen", "backends", "backends[0].models", "keys[0].tiers", "http.listen"} <= paths
    assert "scheduler.fairness_options" in paths and "cluster.redis_url" in paths
    assert len(paths) == len(CASES) > 90


@pytest.mark.parametrize(("path", "raw", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_wrong_type_is_refused_naming_the_key(
    path: str, raw: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith(f"{path}: {expected}"), str(info.value)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[[backends]]\nid = "b"\nkind = "vllm"\nbase_url = "http://127.0.0.1:1"\n'
            'models = "sim"\n',
            "backends[0].models: expected a list of strings, got a string ('sim')",
        ),
        (
            '[[keys]]\nuser = "u"\nsha256 = "' + "0" * 64 + '"\ntiers = "batch"\n',
            "keys[0].tiers: expected a list of strings, got a string ('batch')",
        ),
        (
            '[backends]\nid = "b"\nkind = "vllm"\nbase_url = "http://127.0.0.1:1"\n'
            'models = ["sim"]\n',
            "backends: expected an array of tables ([[backends]] for each), got a table",
        ),
        (
            "listen = 50051\n",
            'listen: expected a string "host:port" (for instance "127.0.0.1:8080"), '
            "got an integer (50051)",
        ),
        ("[http]\nlisten = 8080\n", 'http.listen: expected a string "host:port"'),
        ('metrics_listen = "9464"\n', 'metrics_listen: expected "host:port" with a port'),
        ('[http]\nlisten = "127.0.0.1:99999"\n', 'http.listen: expected "host:port" with'),
        ("[scheduler]\nmax_queued_total = 1e3\n", "expected an integer, got a number (1000.0)"),
        ("[[tiers]]\nname = 3\n", "tiers[0].name: expected a string, got an integer (3)"),
        ('[admin]\nbackend_allowlist = ["10.0.0.0/8", 7]\n', "expected a list of strings"),
        ('tiers = ["batch"]\n', "tiers: expected an array of tables ([[tiers]] for each), got"),
    ],
)
def test_the_operator_slips_from_the_first_hour(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "fairq.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)


def test_right_types_still_load() -> None:
    config = parse_config(
        {
            "listen": "[::1]:0",
            "http": {"listen": "127.0.0.1:0"},
            "scheduler": {"poll_interval_seconds": 1, "fairness_options": {}},
            "backends": [{**_VALID_ITEM["backends"], "models": ["a", "b"]}],
            "keys": [{**_VALID_ITEM["keys"], "tiers": ["batch"], "weight": 2}],
        }
    )
    assert config.backends[0].models == ("a", "b")
    assert config.keys[0].tiers == ("batch",)
    assert config.scheduler.poll_interval_seconds == 1
