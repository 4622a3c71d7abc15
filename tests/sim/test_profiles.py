"""Profiles: the calibration reproduces the measurements it was derived from."""

from __future__ import annotations

import dataclasses

import pytest

from fairq_sim import PROFILES, SimConfig, calibrate, get_profile
from fairq_sim.profiles import TINY_CPU_MEASUREMENTS, Measurements

from .helpers import make_engine, request, run_until_idle, step


def test_calibrate_solves_the_three_facts_exactly() -> None:
    m = TINY_CPU_MEASUREMENTS
    alpha, beta, gamma = calibrate(m)
    assert alpha + beta + gamma * m.prompt_alone == pytest.approx(m.ttft_alone)
    assert m.concurrency / (alpha + beta * m.concurrency) == pytest.approx(m.tokens_per_second)
    steps = m.flood_requests * m.flood_output_tokens / m.flood_slots
    flood = (
        steps * (alpha + beta * m.flood_slots) + m.flood_requests * gamma * m.flood_prompt_tokens
    )
    assert flood + m.ttft_alone == pytest.approx(m.ttft_behind_flood)
    tiny = PROFILES["tiny-cpu"]
    assert (tiny.alpha, tiny.beta, tiny.gamma) == (alpha, beta, gamma)
    assert tiny.alpha == pytest.approx(0.000865, rel=0.01)
    assert tiny.beta == pytest.approx(0.000152, rel=0.01)
    assert tiny.gamma == pytest.approx(0.000818, rel=0.01)


def test_calibrate_rejects_inconsistent_measurements() -> None:
    with pytest.raises(ValueError, match="negative"):
        calibrate(dataclasses.replace(TINY_CPU_MEASUREMENTS, ttft_behind_flood=0.5))


def test_tiny_cpu_engine_reproduces_the_flood_ttft() -> None:
    """60 queued 300-token requests on 4 slots, then a light request: TTFT as measured."""
    m = TINY_CPU_MEASUREMENTS
    engine, clock, _ = make_engine(PROFILES["tiny-cpu"])
    for i in range(60):
        prompt = m.flood_prompt_tokens
        engine.add_request(request(f"flood-{i}", prompt, max_tokens=300, base=10_000 * (i + 1)))
    light = request("light", m.prompt_alone, max_tokens=1, base=5)
    engine.add_request(light)
    run_until_idle(engine, clock)
    assert light.first_token_time is not None
    assert light.first_token_time == pytest.approx(
        TINY_CPU_MEASUREMENTS.ttft_behind_flood, rel=0.05
    )


def test_tiny_cpu_engine_alone_ttft_and_throughput() -> None:
    engine, clock, _ = make_engine(PROFILES["tiny-cpu"])
    m = TINY_CPU_MEASUREMENTS
    r = request("alone", m.prompt_alone, max_tokens=1)
    engine.add_request(r)
    step(engine, clock)
    assert r.first_token_time == pytest.approx(m.ttft_alone)
    big = dataclasses.replace(PROFILES["tiny-cpu"], max_num_seqs=32)
    engine, clock, _ = make_engine(big)
    for i in range(32):
        engine.add_request(request(f"s{i}", 20, max_tokens=200, base=1000 * (i + 1)))
    step(engine, clock)  # prefill all 32
    start, tokens = clock(), 0
    for _ in range(100):
        _, outputs = step(engine, clock)
        tokens += len(outputs)
    assert tokens / (clock() - start) == pytest.approx(m.tokens_per_second, rel=0.01)


def test_llama_8b_gpu_profile_is_in_published_ranges() -> None:
    p = get_profile("llama-8b-gpu")
    assert 0.010 <= p.step_seconds(1, 0) <= 0.015  # batch-1 decode step
    assert 3000 <= 128 / p.step_seconds(128, 0) <= 4000  # output tokens/s at batch 128
    assert 300_000 <= p.kv_blocks * p.block_size <= 500_000  # ~52 GB / 128 KiB per token


def test_unknown_profile_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="llama-8b-gpu, tiny-cpu"):
        get_profile("h100-70b")


def test_config_overrides_and_validation() -> None:
    cfg = SimConfig(max_num_seqs=8, block_size=16, kv_blocks=100)
    p = cfg.resolved_profile()
    assert (p.max_num_seqs, p.block_size, p.kv_blocks, p.max_model_len) == (8, 16, 100, 512)
    cfg.validate()
    for bad, match in (
        (SimConfig(mode="lmdeploy"), "mode"),  # type: ignore[arg-type]
        (SimConfig(mode="tgi", priority_mode=True), "priority"),
        (SimConfig(speed=0), "speed"),
        (SimConfig(error_rate=1.5), "error_rate"),
        (SimConfig(kv_blocks=2), "KV cache"),
        (SimConfig(profile="nope"), "unknown simulator profile"),
    ):
        with pytest.raises(ValueError, match=match):
            bad.validate()


def test_measurements_are_a_dataclass_for_future_calibration_runs() -> None:
    fields = {f.name for f in dataclasses.fields(Measurements)}
    assert {"ttft_alone", "tokens_per_second", "ttft_behind_flood", "flood_slots"} <= fields
