"""The whole configuration: one TOML file, every section a frozen dataclass of its own module.

Example::

    listen = "127.0.0.1:50051"
    metrics_listen = "127.0.0.1:9464"      # "" turns fairq's own /metrics off
    access_log = false                      # true: one JSON line per request on stdout

    [http]                                  # the OpenAI-compatible HTTP door (off if absent)
    listen = "127.0.0.1:8080"

    [scheduler]
    fairness = "round-robin"                # or "vtc"

    [[tiers]]                               # strict order: first is served first
    name = "interactive"
    max_backend_waiting = 3

    [[backends]]
    id = "vllm-a"
    kind = "vllm"
    base_url = "http://127.0.0.1:8000"
    models = ["tiny"]

    [[keys]]                                # none at all: x-fairq-user names the caller
    user = "alice"
    sha256 = "2bd806c9..."                  # hex SHA-256 of the API key
    tiers = ["interactive", "batch"]

Every key's type, default, bounds and help are declared on its field (:mod:`.fields`);
``docs/configuration.md`` is generated from them (:mod:`.reference`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from fairq_server.config.backends import DEFAULT_BACKEND_ALLOWLIST, AdminConfig, BackendConfig
from fairq_server.config.cluster import ClusterConfig
from fairq_server.config.console import ConsoleConfig
from fairq_server.config.doors import HttpConfig, RequestBounds, TlsConfig
from fairq_server.config.entitlement import BudgetConfig, QuotaConfig
from fairq_server.config.envoy import EnvoyConfig, ExtprocConfig
from fairq_server.config.fields import Bool, Str, doc, section
from fairq_server.config.identity import JwtConfig, KeyConfig
from fairq_server.config.prices import PriceConfig
from fairq_server.config.scheduler import SchedulerConfig
from fairq_server.config.store import StoreConfig
from fairq_server.config.teams import TeamConfig
from fairq_server.config.tiers import DEFAULT_TIERS, TierConfig
from fairq_server.errors import ConfigError

__all__ = [
    "DEFAULT_BACKEND_ALLOWLIST",
    "DEFAULT_TIERS",
    "AdminConfig",
    "BackendConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "ConsoleConfig",
    "EnvoyConfig",
    "ExtprocConfig",
    "HttpConfig",
    "JwtConfig",
    "KeyConfig",
    "RequestBounds",
    "SchedulerConfig",
    "TierConfig",
    "TlsConfig",
]


@section
@dataclass(frozen=True)
class Config:
    """The whole configuration (``[section]`` and ``[[array]]`` help: each section's module)."""

    listen: Annotated[
        Str, doc("gRPC address (Scheduler, Admin, health, reflection); may be ``unix:PATH``")
    ] = "127.0.0.1:50051"
    metrics_listen: Annotated[
        Str, doc("address of fairq's own Prometheus ``/metrics`` (empty: off)")
    ] = ""
    access_log: Annotated[Bool, doc("one JSON line per finished request on standard output")] = (
        False
    )
    scheduler: Annotated[SchedulerConfig, doc("the plugins, dispatch timing and caps")] = field(
        default_factory=SchedulerConfig
    )
    limits: Annotated[RequestBounds, doc("bounds on request input and buffering")] = field(
        default_factory=RequestBounds
    )
    tls: Annotated[TlsConfig | None, doc("TLS for the gRPC port (absent: plaintext)")] = None
    admin: Annotated[AdminConfig, doc("limits on what the Admin API may register")] = field(
        default_factory=AdminConfig
    )
    http: Annotated[HttpConfig, doc("the OpenAI-compatible HTTP door")] = field(
        default_factory=HttpConfig
    )
    extproc: Annotated[
        ExtprocConfig, doc("the ext_proc door: fairq as an Envoy's endpoint picker")
    ] = field(default_factory=ExtprocConfig)
    envoy: Annotated[EnvoyConfig, doc("what ``fairq envoy bootstrap`` writes")] = field(
        default_factory=EnvoyConfig
    )
    state_file: Annotated[
        Str,
        doc(
            "where a single process keeps the backends registered over RPC, so they survive a "
            "restart (empty: not kept). With ``cluster``, Redis keeps them"
        ),
    ] = ""
    cluster: Annotated[
        ClusterConfig | None,
        doc("several replicas sharing gate, fairness and registry on Redis (absent: one process)"),
    ] = None
    store: Annotated[
        StoreConfig | None,
        doc("the usage ledger's and stored keys' database (absent from the file: a SQLite file)"),
    ] = None
    prices: Annotated[
        Mapping[str, PriceConfig],
        doc("per-model token prices (``[prices.<model>]``), for the ledger's costs and budgets"),
    ] = field(default_factory=dict)
    tiers: Annotated[
        tuple[TierConfig, ...], doc("priority tiers in strict order: first is served first")
    ] = DEFAULT_TIERS
    backends: Annotated[tuple[BackendConfig, ...], doc("backends registered at start-up")] = ()
    keys: Annotated[
        tuple[KeyConfig, ...], doc("API keys (none at all: x-fairq-user names the caller)")
    ] = ()
    teams: Annotated[tuple[TeamConfig, ...], doc("teams and their weights")] = ()
    quotas: Annotated[
        tuple[QuotaConfig, ...], doc("token and request limits per team and user")
    ] = ()
    budgets: Annotated[
        tuple[BudgetConfig, ...], doc("cost limits per team and user, in the units of prices")
    ] = ()
    jwt: Annotated[
        JwtConfig | None, doc("bearer JWTs from an identity provider (absent: refused)")
    ] = None
    console: Annotated[ConsoleConfig, doc("the operators' web console")] = field(
        default_factory=ConsoleConfig
    )

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("tiers: at least one tier is required")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tiers: duplicate names in {names}")
        for key in self.keys:
            unknown = set(key.tiers) - set(names)
            if unknown:
                raise ConfigError(f"keys[{key.user}]: unknown tiers {sorted(unknown)}")
        ids = [b.id for b in self.backends]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"backends: duplicate ids in {ids}")
