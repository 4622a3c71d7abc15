"""Any OpenAI-compatible server (SGLang, llama.cpp's server, ...), with a metric mapping.

Such servers share vLLM's request API (``/v1/completions``, ``/v1/chat/completions``, SSE
chunks with ``choices[].delta``) but name their Prometheus metrics their own way, or export
none. A :class:`MetricMap` says which sample is which; every entry is optional:

- no ``waiting`` metric: fairq cannot see other clients' queue, so it counts only its own
  requests, and the backend's ``max_in_flight`` (its slot count) must be set;
- no ``/metrics`` at all (preset ``none``): scrapes become a ``/v1/models`` health check.

Presets name the metrics of the servers users pick beside vLLM:

- ``sglang``: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``
  and the inter-token latency histogram. SGLang orders by ``priority`` only with
  ``--enable-priority-scheduling``, higher values first unless started with
  ``--schedule-low-priority-values-first``; hence ``priority_order``.
- ``llamacpp``: ``llamacpp:requests_deferred`` (waiting for a slot),
  ``llamacpp:requests_processing``, and time per token from the counters
  ``llamacpp:tokens_predicted_seconds_total`` / ``llamacpp:tokens_predicted_total``
  (llama-server ``--metrics``). Current llama-server exports no KV-cache usage (older
  releases had ``llamacpp:kv_cache_usage_ratio``), so a tier's ``kv_usage_limit`` cannot
  apply to it; fairq says so at the first scrape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairq_server.backends.continuation import continue_openai
from fairq_server.backends.metrics import sample_sums
from fairq_server.backends.openai_wire import openai_body
from fairq_server.backends.request import BackendRequest, MetricsSample
from fairq_server.backends.vllm import VllmBackend
from fairq_server.errors import InvalidRequestError

if TYPE_CHECKING:
    from fairq_server.config.backends import BackendConfig

__all__ = ["METRIC_PRESETS", "MetricMap", "OpenAIBackend", "metric_map"]


@dataclass(frozen=True)
class MetricMap:
    """Sample names to read from ``/metrics``; empty means "not exported".

    Attributes:
        waiting: gauge of requests waiting in the backend's queue.
        running: gauge of requests being generated.
        kv_usage: gauge of KV-cache usage, 0-1.
        tpot_sum: cumulative seconds of time per output token (a histogram's ``_sum``, or a
            counter).
        tpot_count: the matching count (``_count``, or a token counter).
        scrape: whether the backend has ``/metrics`` at all.

    """

    waiting: str = ""
    running: str = ""
    kv_usage: str = ""
    tpot_sum: str = ""
    tpot_count: str = ""
    scrape: bool = True

    def wanted(self) -> tuple[str, ...]:
        """Return the sample names to keep when parsing."""
        names = (self.waiting, self.running, self.kv_usage, self.tpot_sum, self.tpot_count)
        return tuple(n for n in names if n)


METRIC_PRESETS: Mapping[str, MetricMap] = {
    "sglang": MetricMap(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage="sglang:token_usage",
        tpot_sum="sglang:inter_token_latency_seconds_sum",
        tpot_count="sglang:inter_token_latency_seconds_count",
    ),
    "llamacpp": MetricMap(
        waiting="llamacpp:requests_deferred",
        running="llamacpp:requests_processing",
        tpot_sum="llamacpp:tokens_predicted_seconds_total",
        tpot_count="llamacpp:tokens_predicted_total",
    ),
    "none": MetricMap(scrape=False),
}
_PRESET_PRIORITY_ORDER = {"sglang": "higher-first"}
#: Presets of engines that count a stream's tokens in every chunk when asked (llama.cpp's
#: ``timings_per_token``): a continuation then asks for exactly the tokens that remain.
_PRESET_COUNTS_TOKENS = frozenset({"llamacpp"})


def metric_map(cfg: BackendConfig) -> MetricMap:
    """Return the metric mapping of ``cfg``: its preset, with single names overridden.

    Raises:
        InvalidRequestError: unknown preset, a malformed ``tpot_metric``, or no waiting
            metric and no ``max_in_flight`` to bound the backend by.

    """
    preset = cfg.metrics_preset or ("" if cfg.waiting_metric else "none")
    base = METRIC_PRESETS.get(preset, MetricMap()) if preset else MetricMap()
    if preset and preset not in METRIC_PRESETS:
        raise InvalidRequestError(
            f"backend {cfg.id}: metrics_preset {preset!r} unknown; valid: "
            f"{', '.join(METRIC_PRESETS)}"
        )
    tpot_sum, tpot_count = base.tpot_sum, base.tpot_count
    if cfg.tpot_metric:
        name_sum, slash, name_count = cfg.tpot_metric.partition("/")
        if slash and not (name_sum and name_count):
            raise InvalidRequestError(
                f"backend {cfg.id}: tpot_metric is a histogram name or 'sum_name/count_name'"
            )
        tpot_sum, tpot_count = (
            (name_sum, name_count) if slash else (f"{name_sum}_sum", f"{name_sum}_count")
        )
    names = MetricMap(
        waiting=cfg.waiting_metric or base.waiting,
        running=cfg.running_metric or base.running,
        kv_usage=cfg.kv_usage_metric or base.kv_usage,
        tpot_sum=tpot_sum,
        tpot_count=tpot_count,
        scrape=base.scrape or bool(cfg.waiting_metric or cfg.running_metric or cfg.tpot_metric),
    )
    if not names.scrape:
        names = MetricMap(scrape=False)
    if not names.waiting and cfg.max_in_flight < 1:
        raise InvalidRequestError(
            f"backend {cfg.id}: without a waiting metric fairq only sees its own requests; "
            "set max_in_flight to the backend's slot count"
        )
    return names


class OpenAIBackend(VllmBackend):
    """An OpenAI-compatible server whose metrics are named by a :class:`MetricMap`.

    Requests and streams are read as vLLM's (the same API); ``request_id`` is not sent
    (vLLM's own field), ``priority`` only with ``priority_scheduling``, negated for a
    backend that serves higher values first.
    """

    kind = "openai"
    # Its completions API may not take token ids, nor return them: continue by text.
    continues_by_ids = False
    # An OpenAI-compatible server's exporter may not filter by name (SGLang's multiprocess
    # collector answers nothing), and its exposition is small: read it whole.
    metrics_filter = ()

    def __init__(
        self,
        *args: Any,
        metrics: MetricMap | None = None,
        priority_order: str = "lower-first",
        engine_counts: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.metrics = metrics if metrics is not None else MetricMap(scrape=False)
        self.priority_order = priority_order
        self.engine_counts = engine_counts

    @classmethod
    def kind_options(cls, cfg: BackendConfig) -> dict[str, Any]:
        """Return the metric mapping, priority order and token counting of ``cfg``."""
        preset = cfg.metrics_preset
        return {
            "metrics": metric_map(cfg),
            "priority_order": cfg.priority_order
            or _PRESET_PRIORITY_ORDER.get(preset, "lower-first"),
            "engine_counts": preset in _PRESET_COUNTS_TOKENS,
        }

    async def scrape(self, timeout: float) -> MetricsSample:
        """Scrape ``/metrics``; without one, check ``/v1/models`` and report an idle sample."""
        if self.metrics.scrape:
            return await super().scrape(timeout)
        await self.verify_models(timeout)
        return MetricsSample(waiting=0.0, running=0.0)

    def parse_metrics(self, text: str) -> MetricsSample:
        """Read the mapped samples; unmapped ones count as zero (unknown)."""
        m = self.metrics
        sums = sample_sums(text, m.wanted())
        if m.waiting and m.waiting not in sums:
            raise ValueError(f"no {m.waiting} in the metrics")
        figures = (("running", m.running), ("kv_usage", m.kv_usage), ("tpot", m.tpot_count))
        return MetricsSample(
            waiting=sums.get(m.waiting, 0.0),
            running=sums.get(m.running, 0.0),
            kv_usage=sums.get(m.kv_usage) if m.kv_usage else None,
            tpot_sum=sums.get(m.tpot_sum, 0.0),
            tpot_count=sums.get(m.tpot_count, 0.0),
            missing=tuple((f, name) for f, name in figures if not name or name not in sums),
        )

    def payload(self, request: BackendRequest, priority: int) -> tuple[str, dict[str, Any]]:
        """Return the path and JSON body for ``request``."""
        path, body = openai_body(request, self.context_lengths.get(request.model))
        if self.preempt and self.engine_counts:
            # One chunk is not one token on llama.cpp (see predicted_tokens); its own count
            # keeps a continuation's max_tokens exact. Stripped before relaying.
            body["timings_per_token"] = True
        if request.resume is not None:
            continue_openai(body, request.resume, token_ids=self.continues_by_ids)
        if self.priority_scheduling:
            body["priority"] = -priority if self.priority_order == "higher-first" else priority
        return path, body
