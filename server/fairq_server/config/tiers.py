"""The ``[[tiers]]`` section: priority tiers in strict order, each with its backend gate.

Example::

    [[tiers]]                               # strict order: first is served first
    name = "interactive"
    max_backend_waiting = 3
    [[tiers]]
    name = "batch"
    max_backend_waiting = 0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Float, Int, Str, doc, section

__all__ = ["DEFAULT_TIERS", "TierConfig"]


@section
@dataclass(frozen=True)
class TierConfig:
    """One priority tier and its backend gate."""

    name: Annotated[Str, doc("tier name used in requests and keys")]
    max_backend_waiting: Annotated[
        Int,
        doc(
            "admit work only while the backend's estimated waiting queue is below this "
            '(0: "only when the backend queue is empty")',
            ge=0,
        ),
    ] = 3
    tpot_limit_seconds: Annotated[
        Float | None,
        doc(
            "hold while the backend's recent time per output token exceeds this (cannot be "
            "switched off from the file: a large value has the same effect)",
            gt=0,
        ),
    ] = 0.150
    kv_usage_limit: Annotated[
        Float | None, doc("hold while the backend's KV-cache usage (0-1) exceeds this", gt=0, le=1)
    ] = None
    priority: Annotated[
        Int | None,
        doc(
            "value passed as vLLM's ``priority`` (lower runs earlier; may be negative); "
            "default: the tier's index"
        ),
    ] = None
    aging_seconds: Annotated[
        Float | None,
        doc("serve this tier at least once per interval, even over higher tiers", gt=0),
    ] = None
    max_in_flight: Annotated[
        Int, doc("at most this many of the tier's requests in flight per backend (0: no cap)", ge=0)
    ] = 0
    max_backend_in_flight: Annotated[
        Int,
        doc(
            "forward this tier only while the backend has fewer than this many requests in "
            "flight from fairq, of any tier (0: no cap). Set below the backend's running slots, "
            "it keeps the rest free for higher tiers",
            ge=0,
        ),
    ] = 0
    preempt_after_seconds: Annotated[
        Float | None,
        doc(
            "a request of this tier that waited this long for a full backend preempts a "
            "running one (unset: never; ``docs/design/preemption.md``)",
            ge=0,
        ),
    ] = None


DEFAULT_TIERS: tuple[TierConfig, ...] = (
    TierConfig("interactive", max_backend_waiting=3),
    TierConfig("standard", max_backend_waiting=3),
    TierConfig("batch", max_backend_waiting=0),
)
