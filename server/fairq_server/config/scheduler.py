"""The ``[scheduler]`` section: the plugins, dispatch timing, queue caps and prefix grouping.

Example::

    [scheduler]
    fairness = "round-robin"                # or "vtc"
    ordering = "fifo"                       # or "shortest-first"
    poll_interval_seconds = 0.5
    stale_after_seconds = 2.0
    unhealthy_after_failures = 2            # consecutive failed scrapes
    max_queued_per_user = 10000
    max_queued_total = 100000

The plugin names are closed sets here (a test holds each equal to the scheduling registry's
names); each plugin's options table is checked where the plugins are built
(:func:`fairq_server.scheduling.policies.build_policies`), by the plugin's own signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from fairq_server.config.fields import Float, Int, doc, section
from fairq_server.config.preempt import PreemptConfig

__all__ = [
    "FAIRNESS_NAMES",
    "GATE_NAMES",
    "ORDERING_NAMES",
    "ROUTING_NAMES",
    "FairnessName",
    "GateName",
    "OrderingName",
    "RoutingName",
    "SchedulerConfig",
]

FairnessName = Literal["round-robin", "vtc"]
OrderingName = Literal["fifo", "shortest-first"]
GateName = Literal["threshold"]
RoutingName = Literal["prefix-affinity", "least-loaded"]
FAIRNESS_NAMES: tuple[str, ...] = get_args(FairnessName)
ORDERING_NAMES: tuple[str, ...] = get_args(OrderingName)
GATE_NAMES: tuple[str, ...] = get_args(GateName)
ROUTING_NAMES: tuple[str, ...] = get_args(RoutingName)

Options = Mapping[str, Any]


@section
@dataclass(frozen=True)
class SchedulerConfig:
    """Policy names, dispatch timing, caps and prefix grouping."""

    fairness: Annotated[FairnessName, doc("fairness between users: ``round-robin`` or ``vtc``")] = (
        "round-robin"
    )
    fairness_options: Annotated[
        Options,
        doc(
            "options of the fairness policy: vtc takes ``lift`` (true; false banks idle time "
            "as credit, a benchmark baseline only) and ``output_weight`` (2.0)"
        ),
    ] = field(default_factory=dict)
    ordering: Annotated[
        OrderingName, doc("order within a user: ``fifo`` or ``shortest-first``")
    ] = "fifo"
    ordering_options: Annotated[
        Options, doc("options of the ordering policy (the built-in ones take none)")
    ] = field(default_factory=dict)
    gate: Annotated[
        GateName,
        doc(
            "the saturation check deciding whether a backend may take more work; in a "
            "cluster the shared reservation asks the same gate, with every replica's counts"
        ),
    ] = "threshold"
    gate_options: Annotated[
        Options, doc("options of the gate (``threshold`` takes none; its limits are per tier)")
    ] = field(default_factory=dict)
    routing: Annotated[
        RoutingName,
        doc(
            "how a request's backend is chosen among those whose gate is open: "
            "``prefix-affinity`` or ``least-loaded``"
        ),
    ] = "prefix-affinity"
    routing_options: Annotated[
        Options,
        doc(
            "options of the router: prefix-affinity takes ``slack`` (2): how many more "
            "requests in flight than the least loaded backend a backend may have and still "
            "be chosen for its prefix"
        ),
    ] = field(default_factory=dict)
    max_retries: Annotated[
        Int,
        doc(
            "a request that fails on a backend before its first token, for a reason that says "
            "nothing about the request (unreachable, 5xx, overloaded), is sent to another "
            "backend at most this many times",
            ge=0,
        ),
    ] = 1
    poll_interval_seconds: Annotated[
        Float, doc("how often each backend's ``/metrics`` is scraped", gt=0)
    ] = 0.5
    scrape_timeout_seconds: Annotated[
        Float | None,
        doc(
            "a scrape of ``/metrics`` not answered within this has failed (unset: five "
            "``poll_interval_seconds``, at least 1 s)",
            gt=0,
        ),
    ] = None
    stale_after_seconds: Annotated[
        Float,
        doc("older metrics count as saturated (no dispatch); keep it a few poll intervals", gt=0),
    ] = 2.0
    unhealthy_after_failures: Annotated[
        Int,
        doc(
            "a backend that has answered before is marked unhealthy only after this many "
            "consecutive failed scrapes (one that never answered, from its first failure); "
            "the gate still fails closed after ``stale_after_seconds``",
            ge=1,
        ),
    ] = 2
    backend_timeout_seconds: Annotated[Float, doc("HTTP timeout towards a backend", gt=0)] = 600.0
    max_queued_per_user: Annotated[
        Int,
        doc("one user's queued requests at most, over all models (RESOURCE_EXHAUSTED)", gt=0),
    ] = 10_000
    max_queued_total: Annotated[
        Int, doc("queued requests of this process at most, over all models", gt=0)
    ] = 100_000
    queue_ttl_seconds: Annotated[
        Float | None,
        doc("a request still queued after this long is answered DEADLINE_EXCEEDED", gt=0),
    ] = 600.0
    prefix_quantum: Annotated[
        Float,
        doc(
            "Q of prefix grouping: a request whose prefix a backend served recently may be "
            "picked only from users whose fairness counter is within Q of the minimum (0: "
            "pure fairness; units of the fairness policy)",
            ge=0,
        ),
    ] = 0.0
    prefix_block_chars: Annotated[Int, doc("characters per prefix block", gt=0)] = 128
    prefix_cache_blocks: Annotated[Int, doc("prefix blocks remembered per backend (LRU)", ge=0)] = (
        20_000
    )
    prefix_candidates: Annotated[
        Int, doc("at most this many users are compared per pick (bounds the work)", gt=0)
    ] = 8
    routing_slack: Annotated[
        Int | None,
        doc("deprecated alias of ``routing_options.slack`` (setting both is an error)", ge=0),
    ] = None
    stream_coalesce_seconds: Annotated[
        Float,
        doc(
            "text of a fast stream is relayed at most once per this window, merged (the first "
            "token is never held; 0 relays every event at once); stretched up to 5x while the "
            "event loop is above half load",
            ge=0,
        ),
    ] = 0.02
    max_metrics_bytes: Annotated[
        Int, doc("a backend's ``/metrics`` body larger than this is a failed scrape", gt=0)
    ] = 4 * 1024 * 1024
    max_error_body_bytes: Annotated[
        Int, doc("at most this much of a backend's HTTP error body is read", gt=0)
    ] = 16_384
    max_poll_backoff_seconds: Annotated[
        Float,
        doc(
            "a backend failing its scrapes is polled ever less often, doubling from "
            "``poll_interval_seconds`` up to this",
            gt=0,
        ),
    ] = 10.0
    no_backend_grace_seconds: Annotated[
        Float,
        doc(
            "requests queued for a model none of whose backends is healthy are answered "
            "UNAVAILABLE once that has lasted this long",
            ge=0,
        ),
    ] = 5.0
    anticipation_seconds: Annotated[
        Float,
        doc(
            "where a model's slots are known (every backend sets ``max_in_flight``), a slot "
            "freed by a caller below its share waits at most this long for that caller's next "
            "request (0: never)",
            ge=0,
        ),
    ] = 0.05
    preempt: Annotated[
        PreemptConfig, doc("anti-thrash bounds of preemption (``[scheduler.preempt]``)")
    ] = field(default_factory=PreemptConfig)
