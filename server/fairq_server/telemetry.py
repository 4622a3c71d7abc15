"""fairq's own Prometheus metrics. Every metric is declared once, here.

Labels stay low-cardinality: model, tier, backend, outcome, reason and user *group*; never a
request id or a user name.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from fairq_server.tenancy.team_labels import TeamLabels
from fairq_server.tenancy.waits import WaitTally

if TYPE_CHECKING:
    from fairq_server.backends.request import MetricsSample

__all__ = ["Children", "Telemetry", "build_info"]

_M = TypeVar("_M", Counter, Gauge, Histogram)


class Children(Generic[_M]):
    """A labelled metric's children, each looked up once and then kept.

    ``metric.labels(...)`` takes a lock, builds a tuple of strings and looks it up on every
    call: a few microseconds, several times per request. The children a request touches are
    kept here by their label values (as many as the metric has series, already bounded).
    :meth:`Telemetry.forget_backend` and :meth:`Telemetry.forget_model` empty every cache,
    since they remove series.
    """

    def __init__(self, metric: _M) -> None:
        self.metric: _M = metric
        self._by_values: dict[tuple[str, ...], _M] = {}

    def __call__(self, *values: str) -> _M:
        """Return the child of ``values`` (made on first use)."""
        child = self._by_values.get(values)
        if child is None:
            child = self._by_values[values] = self.metric.labels(*values)
        return child

    def forget(self) -> None:
        """Drop every kept child (their series may have been removed)."""
        self._by_values.clear()


def build_info() -> dict[str, str]:
    """Return the labels of ``fairq_build_info``: fairq, Python and gRPC versions."""
    try:
        version = metadata.version("fairq")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "unknown"
    return {
        "version": version,
        "python_version": platform.python_version(),
        # Read from the installed distribution: importing grpc here would tie everything that
        # reports metrics (the dispatcher) to the gRPC door's transport.
        "grpc_version": metadata.version("grpcio"),
    }


_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip


class Telemetry:
    """The metric objects of one fairq instance, on an injectable registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # process_* (CPU seconds, resident memory, open file descriptors, start time) and
        # python_info, as the default registry would have them.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.build = Info("fairq_build", "The running fairq's version.", registry=r)
        self.build.info(build_info())
        self.loop_lag = Histogram(
            "fairq_event_loop_lag_seconds",
            "How late a 10 ms timer fired on fairq's event loop (time the loop spent on "
            "other work without getting back to its timers).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.loop_load = Gauge(
            "fairq_event_loop_load",
            "Load of fairq's event loop over the last 100 ms (0-1): the time its thread ran or "
            "waited for a core (Linux; elsewhere its CPU time) over the wall time, or the share "
            "of the time bulk work waited for a later pass, "
            "whichever is larger.",
            registry=r,
        )
        self.coalesce_stretch = Gauge(
            "fairq_stream_coalesce_stretch",
            "How many times stream_coalesce_seconds fast streams are coalesced for now "
            "(1 up to half the loop's load, up to 5 near its capacity).",
            registry=r,
        )
        self.coalesce_stretch.set(1.0)
        self.gc_pause = Histogram(
            "fairq_gc_pause_seconds",
            "Garbage-collector passes by generation (2: the full pass fairq schedules itself); "
            "the event loop stands still for each.",
            ["generation"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.queue_depth = Gauge(
            "fairq_queue_depth", "Requests waiting in fairq's queue.", ["model", "tier"], registry=r
        )
        self.queue_wait = Histogram(
            "fairq_queue_wait_seconds",
            "Time from arrival to dispatch to a backend.",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "fairq_time_to_first_token_seconds",
            "Time from arrival to the first generated text.",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "fairq_requests_total",
            "Requests by final outcome (finished, or the gRPC status name).",
            ["tier", "outcome"],
            registry=r,
        )
        self.dispatches = Counter(
            "fairq_dispatches_total", "Requests forwarded to a backend.", ["backend", "tier"],
            registry=r,
        )  # fmt: skip
        self.boosts = Counter(
            "fairq_fair_share_boosts_total",
            "Requests sent with a fair-share boost (their user held less than a fair share of "
            "the backend).",
            ["backend"], registry=r,
        )  # fmt: skip
        self.gate_refusals = Counter(
            "fairq_gate_refusals_total",
            "Requests that were next in line and found a backend's gate closed, by reason; "
            "each request counts once per backend, however long it then waits.",
            ["backend", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "fairq_retries_total", "Requests retried after failing before the first token.",
            ["backend"], registry=r,
        )  # fmt: skip
        self.preemptions = Counter(
            "fairq_preemptions_total",
            "Running requests preempted for a waiting one, by reason (tier: the victim was of "
            "a lower tier; fair-share: its user held more than a fair share).",
            ["backend", "reason"], registry=r,
        )  # fmt: skip
        self.preempt_regenerated = Counter(
            "fairq_preempt_regenerated_tokens_total",
            "Tokens a preempted request generated that its continuation generates again "
            "(read but left out: bytes of an incomplete character).",
            ["backend"], registry=r,
        )  # fmt: skip
        self.preempt_resumed = Counter(
            "fairq_preempt_resumed_tokens_total",
            "Generated tokens a preempted request's continuation reads again as its prompt.",
            ["backend"], registry=r,
        )  # fmt: skip
        self.preempt_prefill = Counter(
            "fairq_preempt_prefill_tokens_total",
            "Prefill tokens a preempted request's continuation does again (prompt plus output "
            "so far; a prefix cache makes most of it cheap).",
            ["backend"], registry=r,
        )  # fmt: skip
        self.anticipation = Counter(
            "fairq_anticipation_holds_total",
            "Slots freed by a caller below its share and held for its next request, by outcome: "
            "taken (it came back in time) or lapsed (the slot went to the fair pick).",
            ["model", "outcome"], registry=r,
        )  # fmt: skip
        self.preempt_repaid = Counter(
            "fairq_preempt_repaid_total",
            "Preempted requests started again in the slot they lent, as the request that "
            "took it ended.",
            ["backend"], registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "fairq_tokens_total", "Tokens served, by user group and kind (prompt, completion).",
            ["group", "kind"], registry=r,
        )  # fmt: skip
        self.team_tokens = Counter(
            "fairq_team_tokens_total",
            "Tokens served, by team (a bounded set: past it, 'other'; no team: 'none') and "
            "kind (prompt, completion).",
            ["team", "kind"], registry=r,
        )  # fmt: skip
        self.team_labels = TeamLabels()
        # Per user and team waits for the console's trends (no label per user: unbounded).
        self.waits = WaitTally()
        # The children the per-request path touches, kept (see Children).
        self.queue_wait_of = Children(self.queue_wait)
        self.ttft_of = Children(self.ttft)
        self.requests_of = Children(self.requests)
        self.dispatches_of = Children(self.dispatches)
        self.boosts_of = Children(self.boosts)
        self.tokens_of = Children(self.tokens)
        self.team_tokens_of = Children(self.team_tokens)
        self.backend_waiting = Gauge(
            "fairq_backend_waiting", "Last scraped backend waiting queue.", ["backend"], registry=r
        )
        self.backend_running = Gauge(
            "fairq_backend_running", "Last scraped backend running requests.", ["backend"],
            registry=r,
        )  # fmt: skip
        self.backend_tpot = Gauge(
            "fairq_backend_tpot_seconds", "Backend time per output token over the last window.",
            ["backend"], registry=r,
        )  # fmt: skip
        self.backend_in_flight = Gauge(
            "fairq_backend_in_flight", "Requests fairq has in flight on a backend.", ["backend"],
            registry=r,
        )  # fmt: skip
        self.in_flight_of = Children(self.backend_in_flight)
        self.backend_healthy = Gauge(
            "fairq_backend_healthy", "0 while failed scrapes have marked the backend unhealthy.",
            ["backend"], registry=r,
        )  # fmt: skip
        self.metric_missing = Gauge(
            "fairq_backend_metric_missing",
            "1 for each metric the configuration relies on that a backend's /metrics lacks "
            "(the limit reading it does nothing on that backend).",
            ["backend", "metric"], registry=r,
        )  # fmt: skip
        self.scrape_failures = Counter(
            "fairq_backend_scrape_failures_total", "Failed scrapes of a backend's /metrics.",
            ["backend"], registry=r,
        )  # fmt: skip

    def scraped(
        self, backend_id: str, sample: MetricsSample | None, tpot: float | None,
        *, healthy: bool, failed: bool, gaps: Sequence[tuple[str, str]] = (),
    ) -> None:  # fmt: skip
        """Record a scrape's outcome: health, a failure, or the backend's fresh figures.

        ``gaps`` are the ``(figure, metric)`` the backend's metrics lack (one series each).
        """
        self.backend_healthy.labels(backend_id).set(1 if healthy else 0)
        self.metric_missing.remove_by_labels({"backend": backend_id})
        for figure, name in gaps:
            self.metric_missing.labels(backend_id, name or figure).set(1)
        if failed:
            self.scrape_failures.labels(backend_id).inc()
        elif sample is not None:
            self.backend_waiting.labels(backend_id).set(sample.waiting)
            self.backend_running.labels(backend_id).set(sample.running)
            self.backend_tpot.labels(backend_id).set(tpot or 0.0)

    def loop_sample(self, load: float, stretch: float) -> None:
        """Publish a load sample of the event loop and the coalescing stretch it set."""
        self.loop_load.set(load)
        self.coalesce_stretch.set(stretch)

    def forget_backend(self, backend_id: str) -> None:
        """Remove every series labelled with ``backend_id`` (it was deregistered).

        Without this a fleet that churns backends (autoscaling, restarts under new ids) grows
        fairq's ``/metrics`` and memory for good, one set of series per id ever seen.
        """
        for metric in (
            self.backend_waiting, self.backend_running, self.backend_tpot,
            self.backend_in_flight, self.backend_healthy, self.scrape_failures,
            self.metric_missing, self.dispatches, self.gate_refusals, self.retries,
            self.preemptions, self.preempt_regenerated, self.preempt_resumed,
            self.preempt_prefill,
        ):  # fmt: skip
            metric.remove_by_labels({"backend": backend_id})
        self._forget_children()

    def forget_model(self, model: str) -> None:
        """Remove every series labelled with ``model`` (its last backend left)."""
        self.queue_depth.remove_by_labels({"model": model})
        self._forget_children()

    def _forget_children(self) -> None:
        for children in (
            self.queue_wait_of, self.ttft_of, self.requests_of, self.dispatches_of,
            self.boosts_of, self.tokens_of, self.team_tokens_of, self.in_flight_of,
        ):  # fmt: skip
            children.forget()
