"""Simulator configuration: which backend to imitate, on which hardware, with which faults."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fairq_sim.profiles import Profile, get_profile, with_overrides

__all__ = ["SimConfig", "SimMode"]

SimMode = Literal["vllm", "tgi", "sglang"]


@dataclass
class SimConfig:
    """Everything a simulated backend needs.

    Capacity fields left at ``None`` take the profile's value. Fault fields are read on every
    request, so a test may change them on a running server (``server.config.error_rate = 1``).

    Attributes:
        mode: ``"vllm"`` (OpenAI-compatible API, vLLM 0.32 metrics), ``"sglang"`` (the same
            OpenAI-compatible API, SGLang's metric names and priority order) or ``"tgi"``
            (TGI 3.3 API and metrics).
        model: Served model name.
        profile: A profile name from ``PROFILES`` or a custom :class:`Profile`.
        max_num_seqs: Most sequences running at once.
        speed: Clock factor; step durations are divided by it. Every time the simulator reports
            (metrics, streams) is wall-clock time, so at speed 10 it behaves like a machine ten
            times faster.
        priority_mode: Order the waiting queue by the request's ``priority`` (lower first, ties
            by arrival) like vLLM's ``--scheduling-policy priority``; otherwise first come first
            served and ``priority`` is ignored, as vLLM 0.32 does. vLLM and SGLang modes.
        low_priority_first: SGLang mode: lower ``priority`` values first (SGLang's
            ``--schedule-low-priority-values-first``); by default higher values go first.
        api_key: If set, ``/v1/*`` answers 401 unless ``Authorization: Bearer <api_key>``
            (``vllm serve --api-key``); ``/metrics`` and ``/health`` stay open.
        max_model_len: Context length (TGI: ``max_total_tokens``).
        kv_blocks: KV-cache size in blocks.
        block_size: Tokens per KV block and prefix-cache block.
        max_num_batched_tokens: Token budget per engine step (chunked prefill).
        max_concurrent_requests: TGI only: requests in flight beyond this get "overloaded".
        eos_mean_tokens: If set, requests without ``ignore_eos`` end with an end-of-sequence
            token after a geometrically distributed number of tokens with this mean (drawn
            deterministically from ``seed``); if None they always run to ``max_tokens``.
        seed: Seed for every random choice (generated text, EOS positions, error faults).
        startup_delay: Seconds after start during which every endpoint answers 503.
        error_rate: Fraction of generation requests answered with HTTP 500 before any token.
        drop_after_tokens: Streams are cut (connection closed, no terminating event) after this
            many tokens.
        metrics_fail: ``/metrics`` answers 500.
        metrics_delay: Seconds ``/metrics`` waits before answering.

    """

    mode: SimMode = "vllm"
    model: str = "sim"
    profile: str | Profile = "tiny-cpu"
    max_num_seqs: int | None = None
    speed: float = 1.0
    priority_mode: bool = False
    low_priority_first: bool = False
    api_key: str | None = None
    max_model_len: int | None = None
    kv_blocks: int | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    max_concurrent_requests: int = 128
    eos_mean_tokens: float | None = None
    seed: int = 0
    startup_delay: float = 0.0
    error_rate: float = 0.0
    drop_after_tokens: int | None = None
    metrics_fail: bool = False
    metrics_delay: float = 0.0

    def resolved_profile(self) -> Profile:
        """Return the profile with this config's capacity overrides applied."""
        base = self.profile if isinstance(self.profile, Profile) else get_profile(self.profile)
        return with_overrides(
            base,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            kv_blocks=self.kv_blocks,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )

    def validate(self) -> None:
        """Check the configuration as a whole.

        Raises:
            ValueError: Naming the first offending field.

        """
        if self.mode not in ("vllm", "tgi", "sglang"):
            raise ValueError(f"mode must be 'vllm', 'sglang' or 'tgi', not {self.mode!r}")
        if self.priority_mode and self.mode == "tgi":
            raise ValueError("TGI has no priority scheduling; priority_mode needs mode='vllm'")
        if not self.speed > 0 or math.isinf(self.speed):
            raise ValueError(f"speed must be a positive finite number, not {self.speed}")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be within [0, 1], not {self.error_rate}")
        if self.drop_after_tokens is not None and self.drop_after_tokens < 0:
            raise ValueError("drop_after_tokens must be >= 0")
        if self.eos_mean_tokens is not None and self.eos_mean_tokens < 1:
            raise ValueError("eos_mean_tokens must be >= 1")
        if self.max_concurrent_requests < 1:
            raise ValueError("max_concurrent_requests must be >= 1")
        p = self.resolved_profile()
        for name in ("max_num_seqs", "max_model_len", "kv_blocks", "block_size"):
            if getattr(p, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if p.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if p.kv_blocks * p.block_size < p.max_model_len:
            # One request at full context must fit, or it could never be scheduled.
            raise ValueError(
                f"KV cache ({p.kv_blocks} blocks x {p.block_size}) is smaller than "
                f"max_model_len={p.max_model_len}"
            )
