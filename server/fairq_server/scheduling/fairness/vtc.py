"""Virtual token counters (Sheng et al., OSDI 2024)."""

from __future__ import annotations

from fairq_server.scheduling.fairness.counter import CounterFairness
from fairq_server.scheduling.interfaces import Cost, ServiceCounters

__all__ = ["VtcFairness"]


class VtcFairness(CounterFairness):
    """Charge ``(input + output_weight * output) / weight`` as tokens are processed.

    The estimated prompt is charged at dispatch, as VTC does: without it, one dispatch pass
    would hand every free slot to the same user, since no token has been counted yet; the
    dispatcher settles the estimate against the backend's own count when the request ends.

    Args:
        counters: see :class:`CounterFairness`.
        lift: see :class:`CounterFairness`.
        output_weight: what one output token costs relative to one input token. Decoding a
            token costs a backend more than prefilling one; 2 is the VTC paper's default.

    """

    def __init__(
        self, counters: ServiceCounters | None = None, *, lift: bool = True,
        output_weight: float = 2.0,
    ) -> None:  # fmt: skip
        super().__init__(counters, lift=lift)
        if not output_weight > 0:
            raise ValueError(f"output_weight must be > 0, not {output_weight!r}")
        self.output_weight = output_weight

    def price(self, cost: Cost) -> float:
        """Input tokens plus weighted output tokens."""
        return cost.prompt_tokens + self.output_weight * cost.completion_tokens
