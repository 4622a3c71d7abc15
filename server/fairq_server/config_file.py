"""Reading fairq's TOML file into :class:`~fairq_server.config.Config`, validating everything.

A file is accepted or refused as a whole: every value is type- and range-checked, and what a
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

from fairq_server.backends.spec import check_backend
from fairq_server.config import (
    PRIORITY_ORDERS,
    AdminConfig,
    BackendConfig,
    ClusterConfig,
    Config,
    ConfigError,
    HttpConfig,
    KeyConfig,
    Limits,
    SchedulerConfig,
    TierConfig,
    TlsConfig,
)
from fairq_server.store.settings import PriceConfig, StoreConfig, StoreError, check_prices

__all__ = ["load_config", "parse_config"]

_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def _build(cls: type[Any], section: str, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: expected a table")
    fields = cls.__dataclass_fields__
    unknown = set(raw) - set(fields)
    if unknown:
        raise ConfigError(f"{section}: unknown keys {sorted(unknown)}; valid: {sorted(fields)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    # Plugin options stay a table (a dict), checked by the plugin's registry.
    try:
        built = cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{section}: {exc}") from exc
    _check_values(built, section)
    return built


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
    }
)  # fmt: skip
_SIGNED = frozenset({"priority"})
_FRACTIONS = frozenset({"kv_usage_limit"})
_KIND_NAMES = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def _check_values(obj: Any, section: str) -> None:
    """Refuse a value of the wrong type, a NaN or infinity, or a number out of its range.

    TOML types values itself, so a quoted number or a negative interval would otherwise be
    accepted here and misbehave much later (a string compared with a float at the first
    dispatch, a poller sleeping a negative interval in a busy loop).
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        declared = str(f.type)
        if value is None and declared.endswith("| None"):
            continue
        kind = declared.removesuffix(" | None")
        if kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif kind == "str":
            ok = isinstance(value, str)
        else:
            continue  # tuples and nested tables are checked where they are built or used
        if not ok:
            raise ConfigError(f"{section}.{f.name} must be {_KIND_NAMES[kind]}, not {value!r}")
        if kind not in ("int", "float") or f.name in _SIGNED:
            continue
        if not math.isfinite(value):
            raise ConfigError(f"{section}.{f.name} must be a finite number, not {value!r}")
        if f.name in _FRACTIONS and value > 1:
            raise ConfigError(f"{section}.{f.name} is a fraction (0-1], not {value!r}")
        if value < 0 or (value == 0 and f.name in _POSITIVE):
            bound = "above 0" if f.name in _POSITIVE else "0 or more"
            raise ConfigError(f"{section}.{f.name} must be {bound}, not {value!r}")


def parse_config(raw: dict[str, Any]) -> Config:
    """Build a :class:`Config` from a parsed TOML document.

    Raises:
        ConfigError: on unknown keys, missing required keys or invalid values.

    """
    raw = dict(raw)
    kwargs: dict[str, Any] = {}
    for key in ("listen", "metrics_listen", "state_file"):
        if key in raw:
            kwargs[key] = str(raw.pop(key))
    if "access_log" in raw:
        access_log = raw.pop("access_log")
        if not isinstance(access_log, bool):
            raise ConfigError(f"access_log must be true or false, not {access_log!r}")
        kwargs["access_log"] = access_log
    if "scheduler" in raw:
        kwargs["scheduler"] = _build(SchedulerConfig, "scheduler", raw.pop("scheduler"))
    if "limits" in raw:
        kwargs["limits"] = _build(Limits, "limits", raw.pop("limits"))
    if "tls" in raw:
        kwargs["tls"] = _build(TlsConfig, "tls", raw.pop("tls"))
    if "admin" in raw:
        kwargs["admin"] = _build(AdminConfig, "admin", raw.pop("admin"))
    if "http" in raw:
        kwargs["http"] = _build(HttpConfig, "http", raw.pop("http"))
    if "cluster" in raw:
        kwargs["cluster"] = _build(ClusterConfig, "cluster", raw.pop("cluster"))
    if "tiers" in raw:
        kwargs["tiers"] = tuple(
            _build(TierConfig, f"tiers[{i}]", t) for i, t in enumerate(raw.pop("tiers"))
        )
    if "backends" in raw:
        backends = tuple(
            _build(BackendConfig, f"backends[{i}]", b) for i, b in enumerate(raw.pop("backends"))
        )
        for i, b in enumerate(backends):
            try:
                check_backend(b.id, b.kind, b.base_url, b.models)
            except ValueError as exc:
                raise ConfigError(f"backends[{i}]: {exc}") from None
            if b.priority_order and b.priority_order not in PRIORITY_ORDERS:
                raise ConfigError(f"backends[{i}]: priority_order must be one of {PRIORITY_ORDERS}")
            if b.fair_share_priority and not b.priority_scheduling:
                raise ConfigError(
                    f"backends[{i}]: fair_share_priority needs priority_scheduling = true "
                    "(the backend must order its queue by priority)"
                )
        kwargs["backends"] = backends
    if "keys" in raw:
        keys = tuple(_build(KeyConfig, f"keys[{i}]", k) for i, k in enumerate(raw.pop("keys")))
        for i, key in enumerate(keys):
            if not key.user or len(key.user) > 128:
                raise ConfigError(f"keys[{i}].user must be 1-128 characters")
            if _SHA256_HEX.fullmatch(key.sha256) is None:
                raise ConfigError(
                    f"keys[{i}].sha256 must be 64 hexadecimal digits (the key's SHA-256)"
                )
        kwargs["keys"] = keys
    _store_sections(raw, kwargs)
    if raw:
        raise ConfigError(f"unknown top-level keys {sorted(raw)}")
    config = Config(**kwargs)
    _check_policies(config.scheduler)
    if len(config.backends) > config.admin.max_backends:
        raise ConfigError(
            f"backends: {len(config.backends)} configured; admin.max_backends is "
            f"{config.admin.max_backends}"
        )
    return config


def _store_sections(raw: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """Take ``[store]`` (default: the SQLite file) and ``[prices.<model>]`` out of ``raw``."""
    try:
        kwargs["store"] = _build(StoreConfig, "store", raw.pop("store", {}))
        prices = raw.pop("prices", {})
        if not isinstance(prices, dict):
            raise ConfigError("prices: expected a table of [prices.<model>] tables")
        built = {m: _build(PriceConfig, f"prices.{m}", p) for m, p in prices.items()}
        check_prices(built, {m for b in kwargs.get("backends", ()) for m in b.models})
        kwargs["prices"] = built
    except StoreError as exc:
        raise ConfigError(str(exc)) from None


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
