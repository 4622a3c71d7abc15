"""vLLM 0.32's Prometheus metrics, fed by the simulated engine.

Names, types, help texts, label names and histogram buckets are those of the recorded
``tests/fixtures/metrics-*.txt``. Each app has its own ``CollectorRegistry``, so several
simulated backends can share a process. Metrics that the simulator cannot give a meaning to
(FLOPs estimates, multi-modal and external caches, admission rejections, the HTTP
instrumentator's ``http_*``) are left out rather than faked.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from fairq_sim.engine import Engine
from fairq_sim.events import EngineObserver, StepPlan, TokenOutput
from fairq_sim.profiles import Profile
from fairq_sim.request import FinishReason, SimRequest

__all__ = ["VllmMetrics"]

_LABELS = ("model_name", "engine")
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                  60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_N_BUCKETS = (1, 2, 5, 10, 20)
_PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

# Help texts as vLLM 0.32 prints them (tests/fixtures/metrics-under-flood.txt).
_HELP = {
    "running": "Number of requests in model execution batches.",
    "waiting": "Number of requests waiting to be processed.",
    "waiting_by_reason": (
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
        "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
        "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting."
    ),
    "sleep_state": (
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
        "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
    ),
    "kv_usage": "KV-cache usage. 1 means 100 percent usage.",
    "prefix_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "prompt_by_source": "Number of prompt tokens by source.",
    "prompt_cached": "Number of cached prompt tokens (local + external).",
    "generation_tokens": "Number of generation tokens processed.",
    "success": "Count of successfully processed requests.",
    "iteration": "Histogram of number of tokens per engine_step.",
    "max_gen": "Histogram of maximum number of requested generation tokens.",
    "n": "Histogram of the n request parameter.",
    "max_tokens": "Histogram of the max_tokens request parameter.",
    "ttft": "Histogram of time to first token in seconds.",
    "itl": "Histogram of inter-token latency in seconds.",
    "tpot": "Histogram of time_per_output_token_seconds per request.",
    "e2e": "Histogram of e2e request latency in seconds.",
    "queue": "Histogram of time spent in WAITING phase for request.",
    "inference": "Histogram of time spent in RUNNING phase for request.",
    "prefill": "Histogram of time spent in PREFILL phase for request.",
    "decode": "Histogram of time spent in DECODE phase for request.",
    "num_preemptions": "Histogram of the number of times a request was preempted.",
    "kv_computed": "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
}


def _buckets_1_2_5(limit: int) -> tuple[float, ...]:
    """VLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out: list[float] = []
    magnitude = 1
    while True:
        for m in (1, 2, 5):
            value = m * magnitude
            if value > limit:
                return tuple(out)
            out.append(float(value))
        magnitude *= 10


class VllmMetrics(EngineObserver):
    """Engine observer that maintains vLLM's metrics and renders ``/metrics``.

    Args:
        model: ``model_name`` label value.
        profile: Supplies ``max_model_len`` (token buckets) and cache facts.

    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model: str, profile: Profile) -> None:
        self.registry = CollectorRegistry()
        # A real vLLM process exposes these too; scrapers may rely on process_start_time.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._engine: Engine | None = None
        self._labels = {"model_name": model, "engine": "0"}
        r = self.registry

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, (*_LABELS, *extra), registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, (*_LABELS, *extra), registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, _LABELS, buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", _HELP["running"])
        self.waiting = gauge("vllm:num_requests_waiting", _HELP["waiting"])
        # The simulator's own (not vLLM's): the exact peak, for benchmarks.
        self.waiting_peak = Gauge(
            "fairq_sim_num_requests_waiting_peak",
            "Longest waiting queue after any engine step since the simulator started.",
            registry=r,
        )
        self.waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason", _HELP["waiting_by_reason"], ("reason",)
        )
        sleep_state = gauge("vllm:engine_sleep_state", _HELP["sleep_state"], ("sleep_state",))
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep_state.labels(**self._labels, sleep_state=state).set(value)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", _HELP["kv_usage"])
        self.prefix_queries = counter("vllm:prefix_cache_queries", _HELP["prefix_queries"])
        self.prefix_hits = counter("vllm:prefix_cache_hits", _HELP["prefix_hits"])
        self.preemptions = counter("vllm:num_preemptions", _HELP["preemptions"])
        self.prompt_tokens = counter("vllm:prompt_tokens", _HELP["prompt_tokens"])
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", _HELP["prompt_by_source"], ("source",)
        )
        self.prompt_cached = counter("vllm:prompt_tokens_cached", _HELP["prompt_cached"])
        self.generation_tokens = counter("vllm:generation_tokens", _HELP["generation_tokens"])
        self.success = counter("vllm:request_success", _HELP["success"], ("finished_reason",))
        tokens = _buckets_1_2_5(profile.max_model_len)
        self.h_prompt = hist("vllm:request_prompt_tokens", _HELP["prompt_tokens"], tokens)
        self.h_generation = hist(
            "vllm:request_generation_tokens", _HELP["generation_tokens"], tokens
        )
        self.h_iteration = hist(
            "vllm:iteration_tokens_total", _HELP["iteration"], _ITERATION_BUCKETS
        )
        self.h_max_gen = hist("vllm:request_max_num_generation_tokens", _HELP["max_gen"], tokens)
        self.h_n = hist("vllm:request_params_n", _HELP["n"], _N_BUCKETS)
        self.h_max_tokens = hist("vllm:request_params_max_tokens", _HELP["max_tokens"], tokens)
        self.h_ttft = hist("vllm:time_to_first_token_seconds", _HELP["ttft"], _TTFT_BUCKETS)
        self.h_itl = hist("vllm:inter_token_latency_seconds", _HELP["itl"], _ITL_BUCKETS)
        self.h_tpot = hist(
            "vllm:request_time_per_output_token_seconds", _HELP["tpot"], _ITL_BUCKETS
        )
        self.h_e2e = hist("vllm:e2e_request_latency_seconds", _HELP["e2e"], _PHASE_BUCKETS)
        self.h_queue = hist("vllm:request_queue_time_seconds", _HELP["queue"], _PHASE_BUCKETS)
        self.h_inference = hist(
            "vllm:request_inference_time_seconds", _HELP["inference"], _PHASE_BUCKETS
        )
        self.h_prefill = hist("vllm:request_prefill_time_seconds", _HELP["prefill"], _PHASE_BUCKETS)
        self.h_decode = hist("vllm:request_decode_time_seconds", _HELP["decode"], _PHASE_BUCKETS)
        self.h_preempt = hist(
            "vllm:request_num_preemptions", _HELP["num_preemptions"], _PREEMPTION_BUCKETS
        )
        self.h_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens", _HELP["kv_computed"], tokens
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"),
            registry=r,
        )
        info.labels(str(profile.block_size), "True", "0", str(profile.kv_blocks)).set(1)
        # vLLM creates every labelled child up front, so zero-valued series are visible.
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**self._labels, reason=reason)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.prompt_by_source.labels(**self._labels, source=source)
        for reason in _FINISHED_REASONS:
            self.success.labels(**self._labels, finished_reason=reason)
        unlabelled: list[Gauge | Counter | Histogram] = [
            self.running, self.waiting, self.kv_usage, self.prefix_queries, self.prefix_hits,
            self.preemptions, self.prompt_tokens, self.prompt_cached, self.generation_tokens,
            self.h_prompt, self.h_generation, self.h_iteration, self.h_max_gen, self.h_n,
            self.h_max_tokens, self.h_ttft, self.h_itl, self.h_tpot, self.h_e2e, self.h_queue,
            self.h_inference, self.h_prefill, self.h_decode, self.h_preempt, self.h_kv_computed,
        ]  # fmt: skip
        for metric in unlabelled:
            metric.labels(**self._labels)

    def bind(self, engine: Engine) -> None:
        """Read gauges (running, waiting, KV usage) from ``engine`` at render time."""
        self._engine = engine

    def render(self, names: Sequence[str] = ()) -> bytes:
        """Return the exposition text, gauges refreshed from the engine.

        With ``names``, only those samples' metrics, as vLLM's prometheus_client app behind
        ``/metrics/`` answers ``name[]`` (its ``/metrics`` route renders everything).
        """
        if self._engine is not None:
            engine = self._engine
            self.running.labels(**self._labels).set(engine.num_running)
            self.waiting.labels(**self._labels).set(engine.num_waiting)
            self.waiting_peak.set(engine.peak_waiting)
            self.waiting_by_reason.labels(**self._labels, reason="capacity").set(engine.num_waiting)
            self.kv_usage.labels(**self._labels).set(engine.kv.usage)
        if names:
            return generate_latest(self.registry.restricted_registry(names))
        return generate_latest(self.registry)

    def on_scheduled(self, request: SimRequest, queried_tokens: int, hit_tokens: int) -> None:
        """Count prefix-cache queries and hits in tokens."""
        self.prefix_queries.labels(**self._labels).inc(queried_tokens)
        self.prefix_hits.labels(**self._labels).inc(hit_tokens)
        if request.num_preemptions == 0:
            source = self.prompt_by_source
            computed = request.num_prompt_tokens - request.num_cached_tokens
            source.labels(**self._labels, source="local_compute").inc(computed)
            source.labels(**self._labels, source="local_cache_hit").inc(request.num_cached_tokens)
            self.prompt_cached.labels(**self._labels).inc(request.num_cached_tokens)

    def on_preempted(self, request: SimRequest) -> None:
        """Count a preemption."""
        self.preemptions.labels(**self._labels).inc()

    def on_step(self, plan: StepPlan) -> None:
        """Observe the tokens computed in one step."""
        self.h_iteration.labels(**self._labels).observe(plan.num_tokens)

    def on_token(self, output: TokenOutput) -> None:
        """Count a generated token; observe TTFT or inter-token latency."""
        request = output.request
        self.generation_tokens.labels(**self._labels).inc()
        if output.index == 1:
            self.prompt_tokens.labels(**self._labels).inc(request.num_prompt_tokens)
            self.h_ttft.labels(**self._labels).observe(output.time - request.arrival_time)
        elif request.last_token_time is not None:
            self.h_itl.labels(**self._labels).observe(output.time - request.last_token_time)

    def on_finished(self, request: SimRequest) -> None:
        """Count the finish reason; observe per-request histograms."""
        reason = request.finish_reason or FinishReason.ABORT
        self.success.labels(**self._labels, finished_reason=reason.value).inc()
        if reason is FinishReason.ABORT:
            return
        assert request.finish_time is not None
        assert request.scheduled_time is not None and request.first_token_time is not None
        labels = self._labels
        generated = request.num_output_tokens
        self.h_prompt.labels(**labels).observe(request.num_prompt_tokens)
        self.h_generation.labels(**labels).observe(generated)
        self.h_max_gen.labels(**labels).observe(request.max_tokens)
        self.h_max_tokens.labels(**labels).observe(request.max_tokens)
        self.h_n.labels(**labels).observe(1)
        self.h_e2e.labels(**labels).observe(request.finish_time - request.arrival_time)
        self.h_queue.labels(**labels).observe(request.scheduled_time - request.arrival_time)
        self.h_inference.labels(**labels).observe(request.finish_time - request.scheduled_time)
        self.h_prefill.labels(**labels).observe(request.first_token_time - request.scheduled_time)
        decode = request.finish_time - request.first_token_time
        self.h_decode.labels(**labels).observe(decode)
        if generated > 1:
            self.h_tpot.labels(**labels).observe(decode / (generated - 1))
        self.h_preempt.labels(**labels).observe(request.num_preemptions)
        self.h_kv_computed.labels(**labels).observe(
            request.num_prompt_tokens - request.num_cached_tokens
        )
