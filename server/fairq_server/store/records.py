"""What the request log hands the usage ledger when a request ends (no database imports)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UsageRecord"]


@dataclass(frozen=True)
class UsageRecord:
    """One finished, failed or cancelled request, as the ledger stores it.

    Attributes:
        ended_at: Unix time the request ended.
        request_id: the request's id (the caller's, or the one fairq gave it).
        user: the fairness identity.
        team: the caller's team, None when it has none.
        model: the model asked for.
        backend: the backend that served it ("" when it was never dispatched).
        tier: the tier it ran in.
        input_tokens: prompt tokens, as the backend counted them (0 if it did not finish).
        output_tokens: completion tokens, as the backend counted them.
        queue_seconds: time in fairq's queue, None when it never left it.
        ttft_seconds: time to the first token, None when none came.
        outcome: ``finished``, ``cancelled`` or a lower-case status name.

    """

    ended_at: float
    request_id: str
    user: str
    team: str | None
    model: str
    backend: str
    tier: str
    input_tokens: int
    output_tokens: int
    queue_seconds: float | None
    ttft_seconds: float | None
    outcome: str
