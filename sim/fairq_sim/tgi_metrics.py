"""TGI 3.3's Prometheus metrics, rendered the way metrics-exporter-prometheus does.

TGI records through the Rust ``metrics`` crate, whose Prometheus exporter differs from
prometheus_client in ways a scraper can see: counters carry no ``_total`` suffix and no
``_created`` series, a series appears only after its first use, numbers print as Rust prints
them (``3``, not ``3.0``), and every metric block ends with a blank line. This module keeps
its own counters and histograms and renders that format itself.

Buckets follow TGI's router: durations are 0.00015 x 1.5^k for k = 0..34 (computed by
repeated multiplication, as TGI does, so the ``le`` strings match), input and generated token
counts are 100 linear steps up to ``max_input_tokens`` and ``max_total_tokens``, and batch
sizes are 1..1024.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from decimal import Decimal

from fairq_sim.engine import Engine
from fairq_sim.events import EngineObserver, StepPlan
from fairq_sim.request import FinishReason, SimRequest

__all__ = ["TgiMetrics", "rust_float"]


def _duration_buckets() -> list[float]:
    value, out = 0.0001, []
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return out


_DURATION_BUCKETS = _duration_buckets()
_BATCH_BUCKETS = [float(x + 1) for x in range(1024)]
# The first description registered wins in the exporter; these are TGI's first ones.
_HELP = {
    "tgi_request_success": "Number of successful requests",
    "tgi_request_duration": "Request duration",
    "tgi_request_validation_duration": "Request validation duration",
    "tgi_request_queue_duration": "Request queue duration",
    "tgi_request_inference_duration": "Request inference duration",
    "tgi_request_mean_time_per_token_duration": "Mean time per token per request",
    "tgi_request_generated_tokens": "Generated tokens per request",
    "tgi_batch_inference_count": "Inference calls per method (prefill or decode)",
    "tgi_request_count": "Total number of requests",
    "tgi_batch_inference_success": (
        "Number of successful inference calls per method (prefill or decode)"
    ),
    "tgi_batch_current_size": "Current batch size",
    "tgi_queue_size": "Current queue size",
    "tgi_batch_current_max_tokens": "Maximum tokens for the current batch",
    "tgi_request_max_new_tokens": "Maximum new tokens per request",
    "tgi_batch_inference_duration": "Batch inference duration",
    "tgi_batch_forward_duration": "Batch forward duration per method (prefill or decode)",
    "tgi_request_input_length": "Input token length per request",
    "tgi_batch_next_size": "Batch size of the next batch",
}

Labels = tuple[tuple[str, str], ...]


def rust_float(value: float) -> str:
    """Format ``value`` as Rust's ``Display`` for ``f64`` does (no exponent, no ``.0``)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if value.is_integer():
        return str(int(value))
    text = repr(value)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text


class _Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = list(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # Per-bucket (not cumulative) counts; rendering accumulates them.
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.buckets):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        return list(itertools.accumulate(self.counts))


class TgiMetrics(EngineObserver):
    """Engine observer plus HTTP-layer hooks that render TGI's ``/metrics``.

    Args:
        max_input_tokens: Upper end of the input-length buckets.
        max_total_tokens: Upper end of the generated/max-new-tokens buckets.

    """

    content_type = "text/plain; charset=utf-8"

    def __init__(self, max_input_tokens: int, max_total_tokens: int) -> None:
        self._engine: Engine | None = None
        self._counters: dict[str, dict[Labels, int]] = {}
        self._gauges: dict[str, dict[Labels, float]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}
        self._buckets: dict[str, list[float]] = {
            "tgi_request_input_length": [max_input_tokens / 100 * (x + 1) for x in range(100)],
            "tgi_request_generated_tokens": [max_total_tokens / 100 * (x + 1) for x in range(100)],
            "tgi_request_max_new_tokens": [max_total_tokens / 100 * (x + 1) for x in range(100)],
            "tgi_batch_next_size": _BATCH_BUCKETS,
        }
        self._queue_used = False
        # TGI's v3 backend sets this gauge once at startup.
        self.set_gauge("tgi_batch_max_total_tokens", float(max_total_tokens))

    def bind(self, engine: Engine) -> None:
        """Read the queue and batch gauges from ``engine`` at render time."""
        self._engine = engine

    def increment(self, name: str, labels: Labels = (), by: int = 1) -> None:
        """Add ``by`` to a counter, creating the series on first use."""
        series = self._counters.setdefault(name, {})
        series[labels] = series.get(labels, 0) + by

    def set_gauge(self, name: str, value: float, labels: Labels = ()) -> None:
        """Set a gauge, creating the series on first use."""
        self._gauges.setdefault(name, {})[labels] = value

    def observe(self, name: str, value: float, labels: Labels = ()) -> None:
        """Record a histogram sample, creating the series on first use."""
        series = self._histograms.setdefault(name, {})
        histogram = series.get(labels)
        if histogram is None:
            histogram = series[labels] = _Histogram(self._buckets.get(name, _DURATION_BUCKETS))
        histogram.observe(value)

    def render(self) -> bytes:
        """Return the exposition text: counters, then gauges, then histograms."""
        self._refresh_gauges()
        out: list[str] = []
        for name, counters in sorted(self._counters.items()):
            self._header(out, name, "counter")
            out.extend(f"{name}{_fmt_labels(k)} {v}\n" for k, v in counters.items())
            out.append("\n")
        for name, gauges in sorted(self._gauges.items()):
            self._header(out, name, "gauge")
            out.extend(f"{name}{_fmt_labels(k)} {rust_float(v)}\n" for k, v in gauges.items())
            out.append("\n")
        for name, histograms in sorted(self._histograms.items()):
            self._header(out, name, "histogram")
            for labels, h in histograms.items():
                for bound, count in zip(h.buckets, h.cumulative(), strict=True):
                    le = (*labels, ("le", rust_float(bound)))
                    out.append(f"{name}_bucket{_fmt_labels(le)} {count}\n")
                inf = (*labels, ("le", "+Inf"))
                out.append(f"{name}_bucket{_fmt_labels(inf)} {h.count}\n")
                out.append(f"{name}_sum{_fmt_labels(labels)} {rust_float(h.sum)}\n")
                out.append(f"{name}_count{_fmt_labels(labels)} {h.count}\n")
            out.append("\n")
        return "".join(out).encode()

    def on_scheduled(self, request: SimRequest, queried_tokens: int, hit_tokens: int) -> None:
        """Note that the queue gauge now exists (TGI sets it on first enqueue)."""
        self._queue_used = True

    def on_step(self, plan: StepPlan) -> None:
        """Record one forward pass as TGI's batch metrics do."""
        method = (("method", "prefill"),) if plan.prefill_tokens else (("method", "decode"),)
        self.increment("tgi_batch_inference_count", method)
        self.increment("tgi_batch_inference_success", method)
        self.observe("tgi_batch_forward_duration", plan.duration, method)
        self.observe("tgi_batch_inference_duration", plan.duration, method)
        if plan.prefill_tokens:
            self.observe("tgi_batch_next_size", float(len(plan.scheduled)))

    def on_finished(self, request: SimRequest) -> None:
        """Count a success or a dropped request; observe per-request durations."""
        if request.finish_reason is FinishReason.ABORT:
            self.increment("tgi_request_failure", (("err", "dropped"),))
            return
        assert request.finish_time is not None and request.scheduled_time is not None
        generated = request.num_output_tokens
        inference = request.finish_time - request.scheduled_time
        self.increment("tgi_request_success")
        self.observe("tgi_request_duration", request.finish_time - request.arrival_time)
        self.observe("tgi_request_queue_duration", request.scheduled_time - request.arrival_time)
        self.observe("tgi_request_inference_duration", inference)
        self.observe("tgi_request_mean_time_per_token_duration", inference / max(generated, 1))
        self.observe("tgi_request_generated_tokens", float(generated))

    def _refresh_gauges(self) -> None:
        engine = self._engine
        if engine is None:
            return
        if self._queue_used:
            self.set_gauge("tgi_queue_size", float(engine.num_waiting))
        if "tgi_batch_inference_count" in self._counters:
            running = engine.running
            self.set_gauge("tgi_batch_current_size", float(len(running)))
            self.set_gauge(
                "tgi_batch_current_max_tokens",
                float(sum(r.num_prompt_tokens + r.max_tokens for r in running)),
            )

    @staticmethod
    def _header(out: list[str], name: str, kind: str) -> None:
        help_text = _HELP.get(name)
        if help_text is not None:
            out.append(f"# HELP {name} {help_text}\n")
        out.append(f"# TYPE {name} {kind}\n")


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return "{" + inner + "}"
