"""Synthetic workloads shaped after published LLM traces, with fixed seeds.

Arrivals are open loop: Poisson (exponential gaps) or Gamma-distributed gaps with a
coefficient of variation ``cv`` above 1 for bursty traffic (BurstGPT, Wang et al. 2024, fits
Gamma inter-arrival times to Azure OpenAI traces and finds them far burstier than Poisson).

Lengths are lognormal, clipped, with these medians (all approximate; we did not re-derive them
from the raw traces, we matched the published summary figures):

``CHAT`` (ShareGPT-like chat)
    vLLM's paper (Kwon et al., SOSP 2023, Fig. 11) reports ShareGPT means of about 161 prompt
    and 338 output tokens. We use prompt median 110 (sigma 0.85, mean ~158) and output median
    250 (sigma 0.8, mean ~340 before clipping).
``CONVERSATION`` (Azure LLM inference trace 2023, conversation)
    Splitwise (Patel et al., ISCA 2024) reports medians of about 1020 prompt and 129 output
    tokens. We use those medians with sigma 0.7 / 0.9.
``CODE`` (Azure LLM inference trace 2023, code)
    Same source: medians of about 1500 prompt and 13 output tokens (completion-style).

Token counts are the simulator's (:func:`fairq_sim.tokens.count_tokens`: BOS plus one
token per 4 bytes), so a prompt built by :func:`prompt_text` has exactly the wanted length
there; a real tokenizer would count differently.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fairq_bench.workload import RequestSpec
from fairq_sim.tokens import count_tokens

__all__ = [
    "CHAT",
    "CODE",
    "CONVERSATION",
    "LengthModel",
    "arrivals",
    "prompt_text",
    "prompt_tokens",
    "user_stream",
]


@dataclass(frozen=True)
class LengthModel:
    """Lognormal prompt and output lengths in tokens, clipped to ``[lo, hi]``."""

    name: str
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """Return one ``(prompt_tokens, output_tokens)`` pair."""
        return (
            _lognormal(rng, self.prompt_median, self.prompt_sigma, self.prompt_range),
            _lognormal(rng, self.output_median, self.output_sigma, self.output_range),
        )

    def mean(self) -> tuple[float, float]:
        """Approximate means (clipping ignored), for capacity estimates."""
        return (
            self.prompt_median * math.exp(self.prompt_sigma**2 / 2),
            self.output_median * math.exp(self.output_sigma**2 / 2),
        )


CHAT = LengthModel("ShareGPT-like chat", 110, 0.85, 250, 0.8, (8, 2048), (8, 1024))
CONVERSATION = LengthModel("Azure-2023 conversation", 1020, 0.7, 129, 0.9, (64, 4096), (4, 1024))
CODE = LengthModel("Azure-2023 code", 1500, 0.7, 13, 0.9, (64, 4096), (2, 512))


def _lognormal(rng: random.Random, median: float, sigma: float, bounds: tuple[int, int]) -> int:
    value = rng.lognormvariate(math.log(median), sigma)
    return int(min(max(round(value), bounds[0]), bounds[1]))


def arrivals(
    rng: random.Random, rate: float, start: float, end: float, cv: float = 1.0
) -> list[float]:
    """Open-loop arrival times in ``[start, end)`` at ``rate`` per second.

    Args:
        rng: the seeded generator.
        rate: mean arrivals per second.
        start: first possible arrival time.
        end: no arrival at or after this time.
        cv: coefficient of variation of the gaps: 1 is Poisson, above 1 bursty (Gamma with
            shape ``1 / cv**2``).

    """
    if rate <= 0:
        return []
    shape = 1.0 / (cv * cv)
    times: list[float] = []
    t = start + (
        rng.expovariate(rate) if cv == 1.0 else rng.gammavariate(shape, 1 / (rate * shape))
    )
    while t < end:
        times.append(t)
        gap = rng.expovariate(rate) if cv == 1.0 else rng.gammavariate(shape, 1 / (rate * shape))
        t += gap
    return times


_FILLER = (
    "Fair queueing shares one server among many flows so that no flow can take more than "
    "its share while others wait. "
)


def prompt_text(tokens: int, tag: str, prefix: str = "") -> str:
    """A prompt of exactly ``tokens`` simulator tokens, unique from its start by ``tag``.

    Args:
        tokens: wanted length (>= 2), counted like the simulator (BOS + one per 4 bytes).
        tag: text that makes the prompt unique; it follows ``prefix``.
        prefix: shared leading text (a system prompt), included in ``tokens``.

    """
    head = f"{prefix}[{tag}] "
    want = 4 * (max(tokens, 2) - 1)
    if len(head) >= want:
        return head[:want]
    body = (_FILLER * (want // len(_FILLER) + 1))[: want - len(head)]
    return head + body


def prompt_tokens(spec: RequestSpec) -> int:
    """The simulator's token count of a request's prompt."""
    return count_tokens(spec.prompt)


def user_stream(
    rng: random.Random,
    user: str,
    model: LengthModel,
    times: list[float],
    *,
    tier: str = "",
    prefix: str = "",
) -> list[RequestSpec]:
    """One user's requests at ``times`` with lengths drawn from ``model``."""
    specs = []
    for i, at in enumerate(times):
        p, o = model.draw(rng)
        text = prompt_text(p, f"{user}#{i}", prefix)
        specs.append(RequestSpec(user, text, o, at=at, tier=tier))
    return specs
