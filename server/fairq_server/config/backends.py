"""The ``[[backends]]`` and ``[admin]`` sections, and the rules of a backend definition.

Example::

    [[backends]]
    id = "vllm-a"
    kind = "vllm"
    base_url = "http://127.0.0.1:8000"
    models = ["tiny"]

Both the configuration file and the Admin API describe backends; both go through
:func:`check_backend_config`, so a file is refused at load (or reload) for exactly what a
``RegisterBackend`` call would be refused for, and nothing half-built is left behind. Every
message names the setting it is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, get_args
from urllib.parse import SplitResult, urlsplit

import yarl

from fairq_server.config.fields import Bool, Int, Str, doc, section
from fairq_server.names import MAX_MODELS_PER_BACKEND, check_model, check_token

__all__ = [
    "BACKEND_KIND_NAMES",
    "DEFAULT_BACKEND_ALLOWLIST",
    "MAX_SETTING_CHARS",
    "PRIORITY_ORDERS",
    "AdminConfig",
    "BackendConfig",
    "BackendKind",
    "check_backend",
    "check_backend_config",
    "check_base_url",
]

#: The backend kinds fairq speaks (``backends.kinds.BACKEND_KINDS`` maps each to its adapter;
#: a test holds the two equal).
BackendKind = Literal["vllm", "tgi", "openai"]
BACKEND_KIND_NAMES: tuple[str, ...] = get_args(BackendKind)
#: How the ``openai`` kind's backend reads the ``priority`` fairq sends.
PRIORITY_ORDERS = ("lower-first", "higher-first")
#: Bound on a free-text setting (a metric name, a preset, an environment variable's name).
MAX_SETTING_CHARS = 256
# The free-text settings bounded by MAX_SETTING_CHARS.
_TEXT_SETTINGS = (
    "metrics_preset", "waiting_metric", "running_metric", "kv_usage_metric", "tpot_metric",
    "priority_order", "api_key_env",
)  # fmt: skip


@section
@dataclass(frozen=True)
class BackendConfig:
    """A backend registered at start-up (the Admin API registers more at run time)."""

    id: Annotated[Str, doc("unique id used in routing, logs and metrics")]
    kind: Annotated[
        Str,
        doc(
            "``vllm``, ``tgi`` or ``openai`` (any OpenAI-compatible server: SGLang, "
            "llama.cpp's server, ...)"
        ),
    ]
    base_url: Annotated[
        Str,
        doc(
            "the server's root, ``http(s)://host[:port]``: fairq adds ``/v1/...`` and "
            "``/metrics``, so a URL ending in ``/v1`` is refused"
        ),
    ]
    models: Annotated[
        tuple[Str, ...], doc("the models this backend serves (checked against its /v1/models)")
    ]
    priority_scheduling: Annotated[
        Bool, doc("the backend orders its queue by the request's ``priority``")
    ] = False
    fair_share_priority: Annotated[
        Bool,
        doc(
            "with ``priority_scheduling``, the priority sent also says, inside the tier, "
            "whether the request's user holds less than a fair share of this backend "
            "(``docs/design/fair-share-priority.md``)"
        ),
    ] = False
    max_in_flight: Annotated[
        Int,
        doc(
            "cap on requests fairq keeps in flight here (0: none): the engine's running "
            "slots. For a backend without a waiting metric this is its slot count, and required",
            ge=0,
        ),
    ] = 0
    metrics_preset: Annotated[
        Str,
        doc(
            "``openai`` kind: ``sglang``, ``llamacpp`` or ``none`` (no ``/metrics``: the gate "
            "runs on fairq's own counts and ``max_in_flight``)"
        ),
    ] = ""
    waiting_metric: Annotated[
        Str, doc("``openai`` kind: gauge of requests waiting in the backend")
    ] = ""
    running_metric: Annotated[Str, doc("``openai`` kind: gauge of requests running")] = ""
    kv_usage_metric: Annotated[Str, doc("``openai`` kind: gauge of KV-cache usage 0-1")] = ""
    tpot_metric: Annotated[
        Str,
        doc(
            "``openai`` kind: histogram of time per output token (or inter-token latency); "
            "``sum_name/count_name`` names two counters instead"
        ),
    ] = ""
    priority_order: Annotated[
        Str,
        doc(
            "``lower-first`` (vLLM; SGLang with ``--schedule-low-priority-values-first``) or "
            "``higher-first`` (SGLang's default): how the backend reads the priority fairq sends"
        ),
    ] = ""
    api_key_env: Annotated[
        Str,
        doc("environment variable holding the backend's API key (sent as a Bearer token)"),
    ] = ""
    api_key_file: Annotated[Str, doc("file holding the backend's API key (first line)")] = ""
    verify_models: Annotated[Bool, doc("check ``/v1/models`` lists every registered model")] = True
    preempt: Annotated[
        Bool, doc("fairq may preempt requests running here (needs ``max_in_flight``)")
    ] = False


DEFAULT_BACKEND_ALLOWLIST = (
    "localhost",
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)


@section
@dataclass(frozen=True)
class AdminConfig:
    """Limits on what the Admin API may register."""

    backend_allowlist: Annotated[
        tuple[Str, ...],
        doc(
            "hosts (matched by name, case-insensitive, never resolved) and IP networks "
            "(matched against literal addresses in the URL) a registered backend may point "
            "to; default: loopback and private networks"
        ),
    ] = DEFAULT_BACKEND_ALLOWLIST
    max_backends: Annotated[
        Int,
        doc(
            "registered backends at most, from the file and the Admin API together; a "
            "registration beyond it is answered RESOURCE_EXHAUSTED",
            gt=0,
        ),
    ] = 256


def check_base_url(base_url: str) -> SplitResult:
    """Return the parsed ``base_url`` if it is a plain ``http(s)://host[:port][/path]``.

    Raises:
        ValueError: control characters, another scheme, a bad port, credentials, a query or
            a fragment, or a URL the HTTP client would not accept.

    """
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in base_url):
        raise ValueError("backend base_url contains spaces or control characters")
    try:
        url = urlsplit(base_url)
        url.port  # noqa: B018 - raises ValueError for a port that is not 0-65535
    except ValueError as exc:
        raise ValueError(f"backend base_url is not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"backend base_url must be http(s)://host[:port], not {base_url[:200]!r}")
    if url.query or url.fragment or url.username or url.password:
        raise ValueError("backend base_url must not carry credentials, query or fragment")
    if url.path.rstrip("/").endswith("/v1"):
        # fairq adds the API's paths itself (/v1/chat/completions, /v1/models, /metrics at
        # the root): a base URL ending in /v1 made every request and scrape miss, and every
        # caller got 503 "no healthy backend" with no word of why.
        root = base_url.rstrip("/").removesuffix("/v1")
        raise ValueError(
            f"backend base_url must not end in /v1: fairq adds /v1/... and /metrics itself; "
            f"drop the /v1 ({root[:200]!r}, not {base_url[:200]!r})"
        )
    try:
        yarl.URL(base_url)  # what the HTTP client will make of it (e.g. an IDNA host)
    except ValueError as exc:
        raise ValueError(f"backend base_url is not a valid URL: {exc}") from None
    return url


def check_backend(backend_id: str, kind: str, base_url: str, models: Sequence[str]) -> SplitResult:
    """Check a backend's id, kind, URL and models; return the parsed URL.

    Raises:
        ValueError: the first problem found, naming the setting.

    """
    check_token(backend_id, "backend id")
    if kind not in BACKEND_KIND_NAMES:
        raise ValueError(
            f"backend kind {kind[:32]!r} unknown; valid: {', '.join(BACKEND_KIND_NAMES)}"
        )
    url = check_base_url(base_url)
    if not models:
        raise ValueError("backend must serve at least one named model")
    if len(models) > MAX_MODELS_PER_BACKEND:
        raise ValueError(
            f"backend serves {len(models)} models; the limit is {MAX_MODELS_PER_BACKEND}"
        )
    for model in models:
        check_model(model, "backend model name")
    return url


def check_backend_config(cfg: BackendConfig) -> SplitResult:
    """Check every rule of a backend definition; return its parsed URL.

    Raises:
        ValueError: the first problem found, naming the setting.

    """
    url = check_backend(cfg.id, cfg.kind, cfg.base_url, cfg.models)
    for name in _TEXT_SETTINGS:
        value = getattr(cfg, name)
        if len(value) > MAX_SETTING_CHARS:
            raise ValueError(f"backend {name} is longer than {MAX_SETTING_CHARS} characters")
    if cfg.priority_order not in ("", *PRIORITY_ORDERS):
        raise ValueError(f"backend priority_order must be one of {', '.join(PRIORITY_ORDERS)}")
    if cfg.fair_share_priority and not cfg.priority_scheduling:
        raise ValueError(
            "backend fair_share_priority needs priority_scheduling (the backend must order "
            "its queue by priority)"
        )
    if cfg.preempt and not cfg.max_in_flight:
        raise ValueError(
            "preempt needs max_in_flight (the backend's running slots: fairq frees a slot "
            "only where it knows they are all taken)"
        )
    return url
