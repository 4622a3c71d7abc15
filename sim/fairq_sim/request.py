"""One generation request as the simulated engine sees it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["FinishReason", "RequestStatus", "SimRequest"]


class RequestStatus(enum.Enum):
    """Where a request is in the engine."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Why a request stopped; values are vLLM's ``finished_reason`` label values."""

    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


@dataclass(eq=False)
class SimRequest:
    """A request plus the engine's bookkeeping for it.

    The first block of fields is set by whoever submits the request; the rest belongs to the
    engine. Identity (not value) equality, so requests can live in sets and be removed from
    queues.

    Attributes:
        request_id: Unique id.
        prompt_token_ids: Prompt tokens (see ``tokens.tokenize``).
        max_tokens: Most output tokens; the request ends with ``length`` after this many.
        priority: Lower runs earlier in priority mode.
        ignore_eos: Never end with an EOS token (vLLM's ``ignore_eos``).
        stop: Stop strings; the request ends with ``stop`` when its text contains one.
        seed: Seeds the generated text.
        eos_at: 1-based output position of an EOS token, set by the engine (None: no EOS).

    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    priority: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    seed: int = 0
    eos_at: int | None = None

    status: RequestStatus = RequestStatus.WAITING
    arrival_time: float = 0.0
    arrival_seq: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens: the sequence the KV cache must hold."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Return tokens ``[start, end)`` of prompt followed by output."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]
