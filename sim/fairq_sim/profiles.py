"""Hardware profiles: how long one engine step takes, and the engine's capacity.

A step of a continuous-batching engine runs every scheduled sequence forward once. The simulator
prices it with a linear model::

    step_seconds = alpha + beta * sequences_in_batch + gamma * prefill_tokens_in_step

``alpha`` is the fixed cost of a forward pass (kernel launches, sampling, scheduler, detokenizer),
``beta`` what each extra sequence adds (mostly reading its KV cache), and ``gamma`` what each
prompt token that is not served from the prefix cache adds (prefill is compute-bound). The
simulator divides the result by ``SimConfig.speed``.

Two profiles ship:

``tiny-cpu``
    The CPU build of vLLM 0.32 with a tiny random Llama on this project's 2-core reference
    machine, ``--max-num-seqs 4``. The three parameters come from :func:`calibrate` applied to
    the three measurements in :data:`TINY_CPU_MEASUREMENTS`, from
    ``tests/e2e/test_calibration.py`` (real vLLM and this simulator side by side; medians over
    three calibration runs of three rounds each, since the shared machine is noisy; table
    and method in ``docs/benchmarks/calibration.md``):

    1. alone, the engine's prefill time for the light request: 3.5 ms (vLLM's
       ``request_prefill_time_seconds``; one step, ``alpha + beta + gamma * P`` with the
       simulator's P = 3 tokens for that prompt). Not the end-to-end TTFT (~9 ms): most of
       that is vLLM's API server and engine IPC, which occupy no engine step;
    2. 5.6k tokens/s streamed by 32 concurrent requests with 32 slots
       (``alpha + 32 * beta = 32 / 5_584`` s);
    3. the light request's first token 7.3 s after a flood of 60 x 300-token requests (14
       prompt tokens each) started, with 4 slots (``60 * 300 / 4`` decode steps at batch 4,
       plus the 60 prefills, plus its own step): per run, the real time (7.6-8.2 s) less
       the simulator's own lateness in that run (0.1-1.0 s), median over the runs.

    Solving gives alpha ~0.87 ms, beta ~0.15 ms per sequence, gamma ~0.82 ms per prefill
    token. The linear model has no per-request prefill cost, so ``gamma`` carries vLLM's
    ~2.5 ms fixed cost of a prefill: short prompts are priced right, long ones too high (a
    15-token prompt at batch 32: ~18 ms, where ``metrics-after-requests.txt`` shows 9.6 ms),
    and to keep the flood right a modelled decode step at batch 4 is ~20% shorter than
    vLLM's inter-token latency (1.47 vs ~1.8 ms; the simulator's own lateness makes up about
    half of that when it runs). KV size and block size are those the fixture's
    ``vllm:cache_config_info`` reports (8192 blocks of 128 tokens, 1 GiB), the context
    length that of ``models.json`` (512).

``llama-8b-gpu``
    Llama-3-8B in bf16 with vLLM on one 80 GB A100. Derived from hardware figures and the
    commonly published ranges rather than a measurement of ours:

    - alpha = 12 ms: decode at batch 1 is memory-bound; streaming 16 GB of weights at the
      A100's ~2.0 TB/s takes 8 ms, and the published vLLM batch-1 decode latencies for 8B
      models on A100/H100 sit at 10-15 ms per token once launch and sampling overheads are in.
    - beta = 0.18 ms per sequence: a step at batch 128 of ~35 ms, i.e. ~3.7k output tokens/s,
      in line with published A100 vLLM serving throughputs for Llama-3-8B (3-4k tokens/s at
      high concurrency on ShareGPT-like loads).
    - gamma = 0.08 ms per prompt token: prefill costs ~2 x 8e9 FLOPs per token; at ~200
      TFLOP/s effective (about 2/3 of the A100's 312 TFLOP/s bf16 peak) that is 0.08 ms, i.e.
      ~12k prefill tokens/s.
    - KV: 128 KiB per token (32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes); ~52 GB
      left after weights and activations at ``gpu_memory_utilization=0.9`` holds ~400k
      tokens, i.e. 24,000 blocks of 16. ``max_num_seqs`` 256 and ``max_num_batched_tokens``
      8192 are vLLM's defaults for that GPU; ``max_model_len`` 8192 keeps requests realistic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "PROFILES",
    "TINY_CPU_MEASUREMENTS",
    "Measurements",
    "Profile",
    "calibrate",
    "get_profile",
    "with_overrides",
]


@dataclass(frozen=True)
class Profile:
    """Step-time parameters and engine capacity of one simulated deployment.

    Attributes:
        name: Kebab-case profile name.
        alpha: Fixed seconds per engine step.
        beta: Seconds added per sequence in the batch.
        gamma: Seconds added per prompt token computed (not served from the prefix cache).
        max_num_seqs: Most sequences running at once (vLLM ``--max-num-seqs``).
        max_num_batched_tokens: Token budget per step; longer prompts are prefilled in chunks.
        max_model_len: Context length; prompt plus output never exceeds it.
        kv_blocks: KV-cache size in blocks.
        block_size: Tokens per KV block, also the prefix-cache granularity.

    """

    name: str
    alpha: float
    beta: float
    gamma: float
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_blocks: int
    block_size: int

    def step_seconds(self, sequences: int, prefill_tokens: int) -> float:
        """Return the modelled duration of one step at speed 1."""
        return self.alpha + self.beta * sequences + self.gamma * prefill_tokens


@dataclass(frozen=True)
class Measurements:
    """Latency and throughput facts measured on a real engine, input to :func:`calibrate`.

    Attributes:
        ttft_alone: Seconds to the first token of a request with the engine otherwise idle.
        prompt_alone: Prompt tokens of that request.
        tokens_per_second: Output tokens per second with ``concurrency`` streams all running.
        concurrency: Number of concurrent streams in that throughput run.
        ttft_behind_flood: Seconds to the first token of a light request sent after a flood.
        flood_requests: Requests queued ahead of it.
        flood_output_tokens: Output tokens of each flood request.
        flood_prompt_tokens: Prompt tokens of each flood request.
        flood_slots: ``max_num_seqs`` during the flood run.

    """

    ttft_alone: float
    prompt_alone: int
    tokens_per_second: float
    concurrency: int
    ttft_behind_flood: float
    flood_requests: int
    flood_output_tokens: int
    flood_prompt_tokens: int
    flood_slots: int


TINY_CPU_MEASUREMENTS = Measurements(
    ttft_alone=0.00347,
    prompt_alone=3,
    tokens_per_second=5_584.0,
    concurrency=32,
    ttft_behind_flood=7.32,
    flood_requests=60,
    flood_output_tokens=300,
    flood_prompt_tokens=14,
    flood_slots=4,
)
"""Reference-machine measurements of vLLM 0.32 CPU with a tiny model (see module docstring).

Prompt sizes are the simulator's token counts of the benchmark's prompts (3 and 14; the tiny
model's tokenizer makes 5 and 21 of them), since those are what the simulator prices.
"""


def calibrate(m: Measurements) -> tuple[float, float, float]:
    """Solve the step-time model for ``(alpha, beta, gamma)`` from three measurements.

    The three equations, all linear in the unknowns::

        ttft_alone        = alpha + beta + gamma * prompt_alone
        concurrency / tps = alpha + beta * concurrency
        ttft_behind_flood = steps * (alpha + beta * slots)
                            + flood_requests * gamma * flood_prompt_tokens + ttft_alone

    where ``steps = flood_requests * flood_output_tokens / slots``: with every slot busy the
    light request waits until all the flood's tokens have been generated.

    Args:
        m: The measurements.

    Returns:
        ``(alpha, beta, gamma)`` in seconds.

    Raises:
        ValueError: If the measurements are inconsistent (singular system or a negative term).

    """
    steps = m.flood_requests * m.flood_output_tokens / m.flood_slots
    rows = [
        [1.0, 1.0, float(m.prompt_alone), m.ttft_alone],
        [1.0, float(m.concurrency), 0.0, m.concurrency / m.tokens_per_second],
        [
            steps,
            steps * m.flood_slots,
            float(m.flood_requests * m.flood_prompt_tokens),
            m.ttft_behind_flood - m.ttft_alone,
        ],
    ]
    solution = _solve3(rows)
    if any(value < 0 for value in solution):
        raise ValueError(f"measurements give a negative step-time term: {solution}")
    alpha, beta, gamma = solution
    return alpha, beta, gamma


def _solve3(rows: list[list[float]]) -> list[float]:
    # Gaussian elimination with partial pivoting; three unknowns do not justify numpy.
    n = 3
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-15:
            raise ValueError("measurements do not determine the step-time model")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    result = [0.0] * n
    for r in range(n - 1, -1, -1):
        acc = rows[r][n] - sum(rows[r][c] * result[c] for c in range(r + 1, n))
        result[r] = acc / rows[r][r]
    return result


_TINY_ALPHA, _TINY_BETA, _TINY_GAMMA = calibrate(TINY_CPU_MEASUREMENTS)

PROFILES: dict[str, Profile] = {
    "tiny-cpu": Profile(
        name="tiny-cpu",
        alpha=_TINY_ALPHA,
        beta=_TINY_BETA,
        gamma=_TINY_GAMMA,
        max_num_seqs=4,
        max_num_batched_tokens=4096,
        max_model_len=512,
        kv_blocks=8192,
        block_size=128,
    ),
    "llama-8b-gpu": Profile(
        name="llama-8b-gpu",
        alpha=0.012,
        beta=0.00018,
        gamma=0.00008,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=8192,
        kv_blocks=24_000,
        block_size=16,
    ),
}
"""Built-in profiles by name."""


def get_profile(name: str) -> Profile:
    """Return the built-in profile called ``name``.

    Raises:
        ValueError: For an unknown name; the message lists the valid ones.

    """
    try:
        return PROFILES[name]
    except KeyError:
        valid = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown simulator profile {name!r}; valid: {valid}") from None


def with_overrides(
    profile: Profile,
    *,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    kv_blocks: int | None = None,
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> Profile:
    """Return ``profile`` with every capacity argument that is not None replacing its field."""
    return dataclasses.replace(
        profile,
        max_num_seqs=profile.max_num_seqs if max_num_seqs is None else max_num_seqs,
        max_model_len=profile.max_model_len if max_model_len is None else max_model_len,
        kv_blocks=profile.kv_blocks if kv_blocks is None else kv_blocks,
        block_size=profile.block_size if block_size is None else block_size,
        max_num_batched_tokens=(
            profile.max_num_batched_tokens
            if max_num_batched_tokens is None
            else max_num_batched_tokens
        ),
    )
