"""SGLang's Prometheus metrics (the scheduler's gauges and the tokenizer's histograms).

Names and label names follow SGLang's ``sglang/srt/metrics/collector.py``: gauges
``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage`` (KV-cache
tokens in use, 0-1), ``sglang:gen_throughput``; histograms ``sglang:time_to_first_token_seconds``,
``sglang:inter_token_latency_seconds``, ``sglang:e2e_request_latency_seconds``; counters
``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``,
``sglang:num_requests_total``. Only these, which the simulator can give a meaning to.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from fairq_sim.engine import Engine
from fairq_sim.events import EngineObserver, TokenOutput
from fairq_sim.request import FinishReason, SimRequest

__all__ = ["SglangMetrics"]

_LABELS = ("model_name",)
_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
                 80.0, 100.0, 200.0, 400.0)  # fmt: skip
_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
                0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
                80.0, 100.0, 200.0, 400.0, 800.0)  # fmt: skip


class SglangMetrics(EngineObserver):
    """Engine observer that keeps SGLang's metrics and renders ``/metrics``.

    Args:
        model: ``model_name`` label value.

    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        self._engine: Engine | None = None
        self._labels = {"model_name": model}
        r = self.registry
        self.queue = Gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue",
            _LABELS,
            registry=r,
        )
        self.running = Gauge(
            "sglang:num_running_reqs", "The number of running requests", _LABELS, registry=r
        )
        self.token_usage = Gauge("sglang:token_usage", "The token usage", _LABELS, registry=r)
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", _LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            _LABELS,
            registry=r,
        )
        self.requests = Counter(
            "sglang:num_requests", "Number of requests processed.", _LABELS, registry=r
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LABELS,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _LABELS,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            _LABELS,
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        for metric in (
            self.queue, self.running, self.token_usage, self.prompt_tokens,
            self.generation_tokens, self.requests, self.ttft, self.itl, self.e2e,
        ):  # fmt: skip
            metric.labels(**self._labels)

    def bind(self, engine: Engine) -> None:
        """Read the gauges from ``engine`` at render time."""
        self._engine = engine

    def render(self) -> bytes:
        """Return the exposition text, gauges refreshed from the engine."""
        if self._engine is not None:
            engine = self._engine
            self.queue.labels(**self._labels).set(engine.num_waiting)
            self.running.labels(**self._labels).set(engine.num_running)
            self.token_usage.labels(**self._labels).set(engine.kv.usage)
        return generate_latest(self.registry)

    def on_token(self, output: TokenOutput) -> None:
        """Count a generated token; observe TTFT or inter-token latency."""
        request = output.request
        self.generation_tokens.labels(**self._labels).inc()
        if output.index == 1:
            self.prompt_tokens.labels(**self._labels).inc(request.num_prompt_tokens)
            self.ttft.labels(**self._labels).observe(output.time - request.arrival_time)
        elif request.last_token_time is not None:
            self.itl.labels(**self._labels).observe(output.time - request.last_token_time)

    def on_finished(self, request: SimRequest) -> None:
        """Count the request; observe its end-to-end latency."""
        self.requests.labels(**self._labels).inc()
        if request.finish_reason is FinishReason.ABORT or request.finish_time is None:
            return
        self.e2e.labels(**self._labels).observe(request.finish_time - request.arrival_time)
