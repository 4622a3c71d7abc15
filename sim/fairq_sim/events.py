"""What the engine produces: step plans, token outputs, and observer callbacks.

Metrics live outside the engine. Each backend flavour (vLLM, TGI) subclasses
:class:`EngineObserver` and counts what it needs; the base class ignores everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairq_sim.request import SimRequest

__all__ = ["EngineObserver", "StepPlan", "TokenOutput"]


@dataclass
class StepPlan:
    """One scheduled engine step.

    Attributes:
        scheduled: ``(request, tokens_to_compute)`` for every sequence in the batch.
        prefill_tokens: Tokens computed for sequences still in prefill (priced by ``gamma``).
        start_time: Clock reading when the step was scheduled.
        duration: Modelled seconds the step takes, already divided by the speed factor.
        preempted: Requests evicted back to the waiting queue to make room.

    """

    scheduled: list[tuple[SimRequest, int]]
    prefill_tokens: int
    start_time: float
    duration: float
    preempted: list[SimRequest] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens computed in this step (vLLM's ``iteration_tokens_total``)."""
        return sum(n for _, n in self.scheduled)


@dataclass(frozen=True)
class TokenOutput:
    """One generated token delivered to a request's consumer.

    Attributes:
        request: The request (its ``finish_reason`` is set when ``finished``).
        token_id: Generated token id (``tokens.EOS_TOKEN_ID`` for an end of sequence).
        text: The token's text; EOS is ``""``. When a stop string completes, the full piece.
        index: 1-based position in the output.
        time: Clock reading when the token became available.
        finished: Whether this is the request's last token.

    """

    request: SimRequest
    token_id: int
    text: str
    index: int
    time: float
    finished: bool


class EngineObserver:
    """Callbacks from the engine; every method is a no-op here."""

    def on_scheduled(self, request: SimRequest, queried_tokens: int, hit_tokens: int) -> None:
        """Handle ``request`` leaving the waiting queue with ``hit_tokens`` prefix-cache hits."""

    def on_preempted(self, request: SimRequest) -> None:
        """Handle ``request`` being evicted back to the waiting queue."""

    def on_step(self, plan: StepPlan) -> None:
        """Handle the end of a step."""

    def on_token(self, output: TokenOutput) -> None:
        """Handle a generated token."""

    def on_finished(self, request: SimRequest) -> None:
        """Handle ``request`` finishing (``finish_reason`` says why, ``abort`` included)."""
