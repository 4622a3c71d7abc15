"""Reading fairq's TOML file into :class:`~fairq_server.config.Config`, validating everything.

A file is accepted or refused as a whole: every value is type-checked against its field's declared
type (:mod:`.config_reader`, one reader for every key) and range-checked, and what a
file implies beyond its values (backend URLs and kinds, key digests, tier and policy names) is
checked here too, so that a SIGHUP reload never applies half a file.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from fairq_server.backends.spec import check_backend_config
from fairq_server.config import Config, ConfigError, SchedulerConfig
from fairq_server.config_reader import read_table
from fairq_server.console_config import check_allowed_hosts
from fairq_server.door_config import parse_networks
from fairq_server.entitlement_config import check_entitlement
from fairq_server.identity.settings import (
    MAX_KEY_USER_CHARS,
    MAX_NAME_CHARS,
    check_jwt,
    check_name,
)
from fairq_server.store.settings import PriceConfig, StoreConfig, StoreError, check_prices
from fairq_server.teams import check_teams

__all__ = ["load_config", "parse_config"]

_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


# Settings that must be above zero; every other number must be at least zero, except these
# that may be negative (vLLM's priority is any integer).
_POSITIVE = frozenset(
    {
        "poll_interval_seconds", "stale_after_seconds", "backend_timeout_seconds",
        "queue_ttl_seconds", "max_queued_per_user", "max_queued_total", "prefix_block_chars",
        "prefix_candidates", "tpot_limit_seconds", "kv_usage_limit", "aging_seconds", "weight",
        "max_prompt_chars", "max_messages", "max_tokens", "max_metadata_bytes",
        "max_unread_chars",
        "max_extra_depth", "max_body_bytes", "body_timeout_seconds", "queue_comment_seconds",
        "max_streams_per_connection", "request_receive_seconds", "max_backends",
        "max_metrics_bytes", "max_error_body_bytes", "max_poll_backoff_seconds",
        "head_timeout_seconds", "idle_timeout_seconds", "max_connections",
        "max_connections_per_peer", "max_grpc_connections", "max_answer_chars",
        "max_sequences", "max_prompts", "max_choices", "max_request_seconds",
        "refresh_seconds", "session_seconds", "starved_after_seconds", "max_users",
        "tokens_per_minute", "tokens_per_day", "requests_per_minute", "per_day", "per_month",
    }
)  # fmt: skip
_SIGNED = frozenset({"priority"})
_FRACTIONS = frozenset({"kv_usage_limit"})
_KIND_NAMES = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def _check_values(obj: Any, section: str) -> None:
    """Refuse a NaN or infinity, or a number out of its range (types are already checked).

    A negative interval would otherwise be accepted here and misbehave much later (a poller
    sleeping a negative interval in a busy loop).
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or f.name in _SIGNED:
            continue
        key = f"{section}.{f.name}" if section else f.name
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, not {value!r}")
        if f.name in _FRACTIONS and value > 1:
            raise ConfigError(f"{key} is a fraction (0-1], not {value!r}")
        if value < 0 or (value == 0 and f.name in _POSITIVE):
            bound = "above 0" if f.name in _POSITIVE else "0 or more"
            raise ConfigError(f"{key} must be {bound}, not {value!r}")


def parse_config(raw: dict[str, Any]) -> Config:
    """Build a :class:`Config` from a parsed TOML document.

    Raises:
        ConfigError: on unknown keys, missing required keys or invalid values.

    """
    raw = dict(raw)
    store, prices = raw.pop("store", {}), raw.pop("prices", {})
    config = read_table(Config, "", raw, check=_check_values)
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
    try:
        for i, team in enumerate(config.teams):
            check_name(team.name, f"teams[{i}].name", MAX_NAME_CHARS)
        keyed = [(f"keys[{i}].team", k.team) for i, k in enumerate(config.keys) if k.team]
        check_teams(config.teams, keyed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    config = _with_store_sections(config, store, prices)
    try:
        check_entitlement(
            config.quotas, config.budgets, teams=[t.name for t in config.teams],
            prices=config.prices, served={m for b in config.backends for m in b.models},
        )  # fmt: skip
    except ValueError as exc:
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
    _check_policies(config.scheduler)
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


def _with_store_sections(config: Config, store: object, prices: object) -> Config:
    """Add ``[store]`` (default: the SQLite file) and ``[prices.<model>]`` to ``config``."""
    if not isinstance(prices, dict):
        raise ConfigError(f"prices: expected a table of [prices.<model>] tables, got {prices!r}")
    try:
        built_store = read_table(StoreConfig, "store", store, check=_check_values)
        built = {
            m: read_table(PriceConfig, f"prices.{m}", p, check=_check_values)
            for m, p in prices.items()
        }
        check_prices(built, {m for b in config.backends for m in b.models})
    except StoreError as exc:
        raise ConfigError(str(exc)) from None
    return dataclasses.replace(config, store=built_store, prices=built)


def _check_policies(scheduler: SchedulerConfig) -> None:
    # Imported here: the scheduling package is built on top of this module.
    from fairq_server.scheduling.policies import Policies

    try:
        Policies.from_config(scheduler)
    except ValueError as exc:
        raise ConfigError(f"scheduler: {exc}") from None


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML configuration file."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse_config(raw)
