"""The settings of preemption by continuation (``[scheduler.preempt]``).

Which tiers preempt is a tier's ``preempt_after_seconds``; which backends allow it is a
backend's ``preempt``. Both are off by default. See ``docs/design/preemption.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fairq_server.config.fields import Float, Int, doc, section

__all__ = ["PreemptConfig"]


@section
@dataclass(frozen=True)
class PreemptConfig:
    """Anti-thrash bounds of preemption."""

    min_tokens: Annotated[
        Int,
        doc(
            "a request is never preempted within the first this many tokens of an attempt "
            "(it has just paid its prefill)",
            ge=0,
        ),
    ] = 16
    max_per_request: Annotated[Int, doc("a request is preempted at most this many times", ge=0)] = 2
    max_per_second: Annotated[
        Float, doc("at most this many preemptions per second per backend", ge=0)
    ] = 4.0
