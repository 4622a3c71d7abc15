"""The settings of preemption by continuation (``[scheduler.preempt]``).

Which tiers preempt is a tier's ``preempt_after_seconds``; which backends allow it is a
backend's ``preempt``. Both are off by default. See ``docs/design/preemption.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PreemptConfig"]


@dataclass(frozen=True)
class PreemptConfig:
    """Anti-thrash bounds of preemption.

    Attributes:
        min_tokens: a request is never preempted within the first this many tokens of an
            attempt (it has just paid its prefill, again if it was resumed; its slot would be
            wasted).
        max_per_request: a request is preempted at most this many times.
        max_per_second: at most this many preemptions per second per backend.

    """

    min_tokens: int = 16
    max_per_request: int = 2
    max_per_second: float = 4.0
