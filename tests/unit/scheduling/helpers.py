from __future__ import annotations

from fairq_server.backends.request import BackendRequest, Sampling
from fairq_server.scheduling.ticket import Ticket


def ticket(
    user: str, tier: int = 0, *, prompt: str = "hi", max_tokens: int = 16, weight: float = 1.0
) -> Ticket:
    """A ticket with a recognisable request id: '<user>#<seq>'."""
    t = Ticket(
        request=BackendRequest(model="m", prompt=prompt, sampling=Sampling(max_tokens=max_tokens)),
        user=user,
        tier=tier,
        weight=weight,
        prompt_tokens=len(prompt),
        max_tokens=max_tokens,
    )
    return t
