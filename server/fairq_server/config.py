"""fairq's configuration: one TOML file, loaded into frozen dataclasses (see :mod:`.config_file`).

Example::

    listen = "127.0.0.1:50051"
    metrics_listen = "127.0.0.1:9464"      # "" turns fairq's own /metrics off
    access_log = false                      # true: one JSON line per request on stdout

    [http]                                  # the OpenAI-compatible HTTP door (off if absent)
    listen = "127.0.0.1:8080"

    [scheduler]
    fairness = "round-robin"                # or "vtc"
    ordering = "fifo"                       # or "shortest-first"
    poll_interval_seconds = 0.5
    stale_after_seconds = 2.0
    unhealthy_after_failures = 2            # consecutive failed scrapes
    max_queued_per_user = 10000
    max_queued_total = 100000

    [[tiers]]                               # strict order: first is served first
    name = "interactive"
    max_backend_waiting = 3
    [[tiers]]
    name = "batch"
    max_backend_waiting = 0

    [[backends]]
    id = "vllm-a"
    kind = "vllm"
    base_url = "http://127.0.0.1:8000"
    models = ["tiny"]

    [[keys]]                                # none at all: x-fairq-user names the caller
    user = "alice"
    sha256 = "2bd806c9..."                  # hex SHA-256 of the API key
    tiers = ["interactive", "batch"]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fairq_server.cluster_config import ClusterConfig
from fairq_server.console_config import ConsoleConfig
from fairq_server.door_config import EnvoyConfig, ExtprocConfig, HttpConfig, Limits, TlsConfig
from fairq_server.entitlement_config import BudgetConfig, QuotaConfig
from fairq_server.errors import ConfigError
from fairq_server.identity.settings import JwtConfig, KeyConfig
from fairq_server.preempt_config import PreemptConfig
from fairq_server.store.settings import PriceConfig, StoreConfig
from fairq_server.teams import TeamConfig

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
    "Limits",
    "SchedulerConfig",
    "TierConfig",
    "TlsConfig",
]


@dataclass(frozen=True)
class TierConfig:
    """One priority tier and its backend gate.

    Attributes:
        name: tier name used in requests and keys.
        max_backend_waiting: admit work only while the backend's estimated waiting queue is
            below this (0 means "only when the backend queue is empty").
        tpot_limit_seconds: hold while the backend's recent time per output token exceeds this
            (None turns the check off).
        kv_usage_limit: hold while the backend's KV-cache usage (0-1) exceeds this.
        priority: value passed as vLLM's ``priority`` (lower runs earlier); defaults to the
            tier's index.
        aging_seconds: serve this tier at least once per interval, even over higher tiers.
        max_in_flight: at most this many of the tier's requests in flight per backend (0: no
            cap).
        max_backend_in_flight: forward this tier only while the backend has fewer than this
            many requests in flight from fairq, of any tier (0: no cap). Set below the
            backend's running slots, it keeps the rest free for higher tiers: a higher-tier
            request then starts at once instead of waiting for a lower-tier one to finish.
        preempt_after_seconds: a request of this tier that waited this long for a full
            backend preempts a running one (None: never; ``docs/design/preemption.md``).

    """

    name: str
    max_backend_waiting: int = 3
    tpot_limit_seconds: float | None = 0.150
    kv_usage_limit: float | None = None
    priority: int | None = None
    aging_seconds: float | None = None
    max_in_flight: int = 0
    max_backend_in_flight: int = 0
    preempt_after_seconds: float | None = None


DEFAULT_TIERS: tuple[TierConfig, ...] = (
    TierConfig("interactive", max_backend_waiting=3),
    TierConfig("standard", max_backend_waiting=3),
    TierConfig("batch", max_backend_waiting=0),
)


@dataclass(frozen=True)
class BackendConfig:
    """A backend registered at start-up (the Admin API registers more at run time).

    Attributes:
        id: unique id used in routing, logs and metrics.
        kind: ``vllm``, ``tgi`` or ``openai`` (any OpenAI-compatible server: SGLang,
            llama.cpp's server, ...).
        base_url: ``http(s)://host[:port]``.
        models: the models this backend serves (checked against its ``/v1/models``).
        priority_scheduling: the backend orders its queue by the request's ``priority``.
        fair_share_priority: with ``priority_scheduling``, the priority sent also says, inside
            the tier, whether the request's user holds less than a fair share of this
            backend (see ``docs/design/fair-share-priority.md``); off by default.
        max_in_flight: cap on requests fairq keeps in flight here (0: none). For a backend
            without a waiting metric this is its slot count, and required.
        metrics_preset: ``openai`` kind: ``sglang``, ``llamacpp`` or ``none`` (no
            ``/metrics``: the gate runs on fairq's own counts and ``max_in_flight``).
        waiting_metric: ``openai`` kind: gauge of requests waiting in the backend.
        running_metric: ``openai`` kind: gauge of requests running.
        kv_usage_metric: ``openai`` kind: gauge of KV-cache usage 0-1.
        tpot_metric: ``openai`` kind: histogram of time per output token (or inter-token
            latency); ``sum_name/count_name`` names two counters instead.
        priority_order: ``lower-first`` (vLLM; SGLang with
            ``--schedule-low-priority-values-first``) or ``higher-first`` (SGLang's default):
            how the backend reads the ``priority`` fairq sends.
        api_key_env: environment variable holding the backend's API key (sent as
            ``Authorization: Bearer``).
        api_key_file: file holding the backend's API key (first line).
        verify_models: check ``/v1/models`` lists every registered model.
        preempt: fairq may preempt requests running here (needs ``max_in_flight``).

    """

    id: str
    kind: str
    base_url: str
    models: tuple[str, ...]
    priority_scheduling: bool = False
    fair_share_priority: bool = False
    max_in_flight: int = 0
    metrics_preset: str = ""
    waiting_metric: str = ""
    running_metric: str = ""
    kv_usage_metric: str = ""
    tpot_metric: str = ""
    priority_order: str = ""
    api_key_env: str = ""
    api_key_file: str = ""
    verify_models: bool = True
    preempt: bool = False


DEFAULT_BACKEND_ALLOWLIST = (
    "localhost",
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)


@dataclass(frozen=True)
class AdminConfig:
    """Limits on what the Admin API may register.

    Attributes:
        backend_allowlist: hosts (matched by name, case-insensitive, never resolved) and IP
            networks (matched against literal addresses in the URL) a registered backend may
            point to. Defaults to loopback and private networks.
        max_backends: registered backends at most, from the file and the Admin API together;
            a registration beyond it is answered RESOURCE_EXHAUSTED.

    """

    backend_allowlist: tuple[str, ...] = DEFAULT_BACKEND_ALLOWLIST
    max_backends: int = 256


@dataclass(frozen=True)
class SchedulerConfig:
    """Policy names, dispatch timing, caps and prefix grouping.

    Attributes:
        unhealthy_after_failures: a backend that has answered before is marked unhealthy (no
            new work; UNAVAILABLE when no backend of its model is healthy) only after this
            many consecutive failed scrapes, so one scrape timing out during a momentary stall
            does not take it out. A failed scrape still leaves the old snapshot to go stale,
            so the gate fails closed after ``stale_after_seconds`` regardless. A backend that
            has not answered any scrape yet is unhealthy from its first failure.
        queue_ttl_seconds: a request still queued after this long is answered
            DEADLINE_EXCEEDED (None: no limit beyond the client's own deadline).
        prefix_quantum: Q of prefix grouping: the dispatcher may pick a request whose prefix a
            backend served recently only from users whose fairness counter is within Q of the
            minimum (0 = pure fairness; units are the fairness policy's: requests for
            round-robin, weighted tokens for vtc).
        prefix_block_chars: characters per prefix block.
        prefix_cache_blocks: prefix blocks remembered per backend (LRU).
        prefix_candidates: at most this many users are compared per pick (bounds the work).
        routing_slack: deprecated alias of ``routing_options.slack`` (prefix affinity only).
        stream_coalesce_seconds: text of a fast stream is relayed at most once per this
            window, merged (the first token is never held; 0 relays every event at once);
            stretched up to 5x while the event loop is above half load (``pace``).
        fairness_options: options of the fairness policy (vtc: ``lift``, ``output_weight``).
        ordering_options: options of the ordering policy.
        gate: the saturation check deciding whether a backend may take more work.
        gate_options: options of the gate.
        routing: how a request's backend is chosen among those whose gate is open
            (``prefix-affinity``; ``least-loaded``).
        routing_options: options of the router (prefix-affinity: ``slack``, how many more
            requests in flight than the least loaded backend a backend may have and still be
            chosen for its prefix; 2 by default).
        max_retries: a request that fails on a backend before its first token, for a reason
            that says nothing about the request (unreachable, 5xx, overloaded), is sent to
            another backend at most this many times.
        max_metrics_bytes: a backend's ``/metrics`` body larger than this is a failed scrape
            (read no further).
        max_error_body_bytes: at most this much of a backend's HTTP error body is read (for
            its message); the rest is never read.
        max_poll_backoff_seconds: a backend failing its scrapes is polled ever less often,
            doubling from ``poll_interval_seconds`` up to this, so dead backends cost little.
        no_backend_grace_seconds: requests queued for a model none of whose backends is
            healthy are answered UNAVAILABLE once that has lasted this long (a restarting
            backend within it fails nobody).
        preempt: anti-thrash bounds of preemption (``[scheduler.preempt]``).
        anticipation_seconds: where a model's slots are known (every backend sets
            ``max_in_flight``), a slot freed by a caller below its share waits at most this
            long for that caller's next request (its learned think time; 0 = never).

    """

    fairness: str = "round-robin"
    fairness_options: Mapping[str, Any] = field(default_factory=dict)
    ordering: str = "fifo"
    ordering_options: Mapping[str, Any] = field(default_factory=dict)
    gate: str = "threshold"
    gate_options: Mapping[str, Any] = field(default_factory=dict)
    routing: str = "prefix-affinity"
    routing_options: Mapping[str, Any] = field(default_factory=dict)
    max_retries: int = 1
    poll_interval_seconds: float = 0.5
    stale_after_seconds: float = 2.0
    unhealthy_after_failures: int = 2
    backend_timeout_seconds: float = 600.0
    max_queued_per_user: int = 10_000
    max_queued_total: int = 100_000
    queue_ttl_seconds: float | None = 600.0
    prefix_quantum: float = 0.0
    prefix_block_chars: int = 128
    prefix_cache_blocks: int = 20_000
    prefix_candidates: int = 8
    routing_slack: int | None = None
    stream_coalesce_seconds: float = 0.02
    max_metrics_bytes: int = 4 * 1024 * 1024
    max_error_body_bytes: int = 16_384
    max_poll_backoff_seconds: float = 10.0
    no_backend_grace_seconds: float = 5.0
    anticipation_seconds: float = 0.05
    preempt: PreemptConfig = field(default_factory=PreemptConfig)

    def __post_init__(self) -> None:
        for plugin in ("fairness", "ordering", "gate", "routing"):
            if not isinstance(getattr(self, f"{plugin}_options"), Mapping):
                raise ConfigError(f"scheduler.{plugin}_options must be a table")
        n = self.unhealthy_after_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"scheduler.unhealthy_after_failures must be an integer >= 1, not {n!r}"
            )


@dataclass(frozen=True)
class Config:
    """The whole configuration.

    Attributes:
        access_log: write one JSON line per finished request to standard output (see
            :mod:`fairq_server.requests.access_log`).
        state_file: where a single process keeps the backends registered over RPC, so they
            survive a restart (empty: not kept). With ``cluster``, Redis keeps them.
        cluster: several replicas sharing gate, fairness and registry on Redis (None: one
            process, no Redis).
        store: the usage ledger's and stored keys' database (None: neither; a file's
            default is a SQLite file, see :mod:`fairq_server.store.settings`).
        prices: per-model token prices, for the ledger's costs and the budgets.
        quotas: token and request limits per team and user (:mod:`fairq_server.entitlement`).
        budgets: cost limits per team and user, in the units of ``prices``.

    """

    listen: str = "127.0.0.1:50051"
    metrics_listen: str = ""
    access_log: bool = False
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    limits: Limits = field(default_factory=Limits)
    tls: TlsConfig | None = None
    admin: AdminConfig = field(default_factory=AdminConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    extproc: ExtprocConfig = field(default_factory=ExtprocConfig)
    envoy: EnvoyConfig = field(default_factory=EnvoyConfig)
    state_file: str = ""
    cluster: ClusterConfig | None = None
    store: StoreConfig | None = None
    prices: Mapping[str, PriceConfig] = field(default_factory=dict)
    tiers: tuple[TierConfig, ...] = DEFAULT_TIERS
    backends: tuple[BackendConfig, ...] = ()
    keys: tuple[KeyConfig, ...] = ()
    teams: tuple[TeamConfig, ...] = ()
    quotas: tuple[QuotaConfig, ...] = ()
    budgets: tuple[BudgetConfig, ...] = ()
    jwt: JwtConfig | None = None
    console: ConsoleConfig = field(default_factory=ConsoleConfig)

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
