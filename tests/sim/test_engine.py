"""The simulated engine as pure logic on a manual clock: exact batches, times and orders."""

from __future__ import annotations

import dataclasses

import pytest

from fairq_sim import FinishReason, RequestStatus
from fairq_sim.tokens import EOS_TOKEN_ID, sample_token, token_text

from .helpers import TEST_PROFILE, Recorder, make_engine, request, run_until_idle, step

A, B, G = TEST_PROFILE.alpha, TEST_PROFILE.beta, TEST_PROFILE.gamma


def test_step_time_formula_prefill_then_decode() -> None:
    engine, clock, _ = make_engine()
    engine.add_request(request("r", prompt_len=10, max_tokens=3))
    plan, outputs = step(engine, clock)
    assert plan.prefill_tokens == 10
    assert plan.duration == pytest.approx(A + B * 1 + G * 10)
    assert [o.index for o in outputs] == [1]
    plan, _ = step(engine, clock)
    assert plan.prefill_tokens == 0
    assert plan.duration == pytest.approx(A + B)


def test_step_time_counts_every_sequence_and_only_prefill_tokens() -> None:
    engine, clock, _ = make_engine()
    engine.add_request(request("a", prompt_len=10, max_tokens=5))
    step(engine, clock)
    engine.add_request(request("b", prompt_len=7, max_tokens=5, base=5000))
    plan, _ = step(engine, clock)
    # a decodes one token, b prefills 7: two sequences, 7 prefill tokens.
    assert [(r.request_id, n) for r, n in plan.scheduled] == [("a", 1), ("b", 7)]
    assert plan.duration == pytest.approx(A + 2 * B + 7 * G)


def test_speed_divides_step_time() -> None:
    engine, clock, _ = make_engine(speed=4.0)
    engine.add_request(request("r", prompt_len=10, max_tokens=1))
    plan, _ = step(engine, clock)
    assert plan.duration == pytest.approx((A + B + 10 * G) / 4)
    assert clock() == pytest.approx((A + B + 10 * G) / 4)


def test_batching_limit_is_honoured_and_slots_refill_immediately() -> None:
    engine, clock, _ = make_engine()  # max_num_seqs = 2
    engine.add_request(request("a", 4, max_tokens=2))
    engine.add_request(request("b", 4, max_tokens=5, base=2000))
    engine.add_request(request("c", 4, max_tokens=3, base=3000))
    plan, _ = step(engine, clock)
    assert [r.request_id for r, _ in plan.scheduled] == ["a", "b"]
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    plan, outputs = step(engine, clock)  # a finishes here
    assert [o.request.request_id for o in outputs if o.finished] == ["a"]
    plan, _ = step(engine, clock)  # continuous batching: c takes a's slot at once
    assert [r.request_id for r, _ in plan.scheduled] == ["b", "c"]
    assert engine.running_count == 2


def test_outputs_length_finish_and_timestamps() -> None:
    engine, clock, recorder = make_engine()
    r = request("r", 8, max_tokens=3)
    engine.add_request(r)
    run_until_idle(engine, clock)
    assert [o.index for o in recorder.tokens] == [1, 2, 3]
    assert [o.finished for o in recorder.tokens] == [False, False, True]
    assert r.finish_reason is FinishReason.LENGTH and r.status is RequestStatus.FINISHED
    assert r.first_token_time == pytest.approx(A + B + 8 * G)
    assert r.finish_time == pytest.approx(A + B + 8 * G + 2 * (A + B))
    assert recorder.finished == [("r", "length")]
    assert engine.kv.num_free_blocks == TEST_PROFILE.kv_blocks


def test_text_is_deterministic_per_seed() -> None:
    first, clock, rec1 = make_engine()
    first.add_request(request("r", 4, max_tokens=6, seed=42))
    run_until_idle(first, clock)
    second, clock2, rec2 = make_engine()
    second.add_request(request("other-id", 9, max_tokens=6, seed=42))
    run_until_idle(second, clock2)
    assert [o.text for o in rec1.tokens] == [o.text for o in rec2.tokens]
    assert [o.token_id for o in rec1.tokens] == [sample_token(42, i) for i in range(6)]


def test_prefix_cache_hit_skips_prefill_of_cached_blocks() -> None:
    engine, clock, recorder = make_engine()  # block_size 4
    engine.add_request(request("a", 12, max_tokens=1))
    run_until_idle(engine, clock)
    shared = list(range(1000, 1012))
    engine.add_request(dataclasses.replace(request("b", 0, 1), prompt_token_ids=[*shared, 1, 2, 3]))
    plan, _ = step(engine, clock)
    assert recorder.scheduled[-1] == ("b", 15, 12)  # 3 full blocks hit
    assert plan.prefill_tokens == 3
    assert plan.duration == pytest.approx(A + B + 3 * G)


def test_identical_prompt_recomputes_at_least_its_last_block() -> None:
    engine, clock, recorder = make_engine()
    engine.add_request(request("a", 12, max_tokens=1))
    run_until_idle(engine, clock)
    engine.add_request(request("b", 12, max_tokens=1))
    plan, _ = step(engine, clock)
    # The last token must be computed to sample, so only (12 - 1) // 4 = 2 blocks can hit.
    assert recorder.scheduled[-1] == ("b", 12, 8)
    assert plan.prefill_tokens == 4


def test_different_prefix_same_block_content_does_not_hit() -> None:
    engine, clock, recorder = make_engine()
    engine.add_request(request("a", 12, max_tokens=1))
    run_until_idle(engine, clock)
    # Same second and third blocks, different first block: chained hashes differ.
    prompt = [7, 7, 7, 7, *range(1004, 1012), 5]
    engine.add_request(dataclasses.replace(request("b", 0, 1), prompt_token_ids=prompt))
    step(engine, clock)
    assert recorder.scheduled[-1] == ("b", 13, 0)


def test_prefix_cache_evicts_least_recently_freed_blocks_tail_first() -> None:
    small = dataclasses.replace(TEST_PROFILE, kv_blocks=6, max_model_len=24)
    engine, clock, recorder = make_engine(small)
    engine.add_request(request("a", 8, max_tokens=1, base=100))  # 2 blocks, cached when freed
    run_until_idle(engine, clock)
    engine.add_request(request("b", 20, max_tokens=1, base=500))  # needs 5 of 6 blocks
    run_until_idle(engine, clock)
    engine.add_request(request("a2", 8, max_tokens=1, base=100))
    step(engine, clock)
    # a's blocks were freed tail first, so its second block was evicted before its first.
    assert recorder.scheduled[-1] == ("a2", 8, 4)
    run_until_idle(engine, clock)
    engine.add_request(request("c", 23, max_tokens=1, base=900))  # all 6 blocks
    run_until_idle(engine, clock)
    engine.add_request(request("a3", 8, max_tokens=1, base=100))
    step(engine, clock)
    assert recorder.scheduled[-1] == ("a3", 8, 0)


def admitted(recorder: Recorder) -> list[str]:
    return [rid for rid, _, _ in recorder.scheduled]


def test_fcfs_ignores_priority() -> None:
    engine, clock, recorder = make_engine(dataclasses.replace(TEST_PROFILE, max_num_seqs=1))
    engine.add_request(request("blocker", 4, max_tokens=2))
    step(engine, clock)
    for rid, prio in (("a", 1), ("b", 0), ("c", 1), ("d", 0)):
        engine.add_request(request(rid, 4, max_tokens=1, priority=prio, base=ord(rid) * 100))
    assert [r.request_id for r in engine.waiting] == ["a", "b", "c", "d"]
    run_until_idle(engine, clock)
    assert admitted(recorder) == ["blocker", "a", "b", "c", "d"]


@pytest.mark.parametrize("advance_clock", [True, False])
def test_priority_order_lower_first_ties_by_arrival(advance_clock: bool) -> None:
    profile = dataclasses.replace(TEST_PROFILE, max_num_seqs=1)
    engine, clock, recorder = make_engine(profile, policy="priority")
    engine.add_request(request("blocker", 4, max_tokens=2, priority=9))
    step(engine, clock)
    # Added out of order; with the clock frozen, ties fall back to arrival sequence.
    for rid, prio in (("a", 1), ("b", 0), ("c", 1), ("d", 0), ("e", -1)):
        engine.add_request(request(rid, 4, max_tokens=1, priority=prio, base=ord(rid) * 100))
        if advance_clock:
            clock.advance(0.001)
    assert [r.request_id for r in engine.waiting] == ["e", "b", "d", "a", "c"]
    run_until_idle(engine, clock)
    assert admitted(recorder) == ["blocker", "e", "b", "d", "a", "c"]


def _tight_kv_profile() -> object:
    # 4 blocks of 4 tokens: two requests growing to 4 + 8 tokens cannot both stay resident.
    return dataclasses.replace(TEST_PROFILE, kv_blocks=4, max_model_len=16)


def test_preemption_when_kv_runs_out_fcfs_evicts_latest() -> None:
    engine, clock, recorder = make_engine(_tight_kv_profile())  # type: ignore[arg-type]
    a = request("a", 4, max_tokens=8, base=100)
    b = request("b", 4, max_tokens=8, base=200)
    engine.add_request(a)
    engine.add_request(b)
    run_until_idle(engine, clock)
    assert recorder.preempted and set(recorder.preempted) == {"b"}
    assert engine.num_preemptions == len(recorder.preempted)
    assert a.num_output_tokens == b.num_output_tokens == 8
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert [rid for rid, _ in recorder.finished] == ["a", "b"]
    assert engine.kv.num_free_blocks == 4


def test_preemption_in_priority_mode_evicts_lowest_priority() -> None:
    engine, clock, recorder = make_engine(_tight_kv_profile(), policy="priority")  # type: ignore[arg-type]
    low = request("low", 4, max_tokens=8, base=100, priority=5)
    high = request("high", 4, max_tokens=8, base=200, priority=0)
    engine.add_request(low)  # admitted first, yet evicted: its priority value is larger
    engine.add_request(high)
    run_until_idle(engine, clock)
    assert set(recorder.preempted) == {"low"}
    assert [rid for rid, _ in recorder.finished] == ["high", "low"]


def test_abort_running_frees_slot_and_blocks() -> None:
    engine, clock, recorder = make_engine(dataclasses.replace(TEST_PROFILE, max_num_seqs=1))
    engine.add_request(request("a", 8, max_tokens=50))
    engine.add_request(request("b", 8, max_tokens=1, base=5000))
    step(engine, clock)
    assert engine.running_count == 1 and engine.waiting_count == 1
    assert engine.abort_request("a")
    assert engine.running_count == 0
    assert engine.kv.num_free_blocks == TEST_PROFILE.kv_blocks
    assert recorder.finished == [("a", "abort")]
    plan, _ = step(engine, clock)
    assert [r.request_id for r, _ in plan.scheduled] == ["b"]
    assert not engine.abort_request("a")


def test_abort_waiting_and_abort_during_step() -> None:
    engine, clock, recorder = make_engine(dataclasses.replace(TEST_PROFILE, max_num_seqs=1))
    engine.add_request(request("a", 8, max_tokens=5))
    engine.add_request(request("b", 8, max_tokens=5, base=5000))
    plan = engine.schedule()
    assert plan is not None
    assert engine.abort_request("b")  # still waiting
    assert engine.abort_request("a")  # running, mid-step
    clock.advance(plan.duration)
    assert engine.finish_step(plan) == []
    assert not engine.has_unfinished()
    assert recorder.finished == [("b", "abort"), ("a", "abort")]
    assert engine.schedule() is None


def test_eos_positions_are_seeded_and_ignore_eos_wins() -> None:
    def run(ignore_eos: bool) -> list[tuple[int, str, int | None]]:
        engine, clock, _ = make_engine(eos_mean_tokens=4.0, seed=7)
        reqs = [request(f"r{i}", 4, max_tokens=60, ignore_eos=ignore_eos) for i in range(6)]
        for r in reqs:
            engine.add_request(r)
        run_until_idle(engine, clock)
        return [(r.num_output_tokens, r.finish_reason.value, r.eos_at) for r in reqs]  # type: ignore[union-attr]

    eos = run(False)
    assert eos == run(False)
    assert all(reason == "stop" for n, reason, at in eos if at is not None and at <= 60)
    assert any(n < 60 for n, _, _ in eos)
    assert all((n, reason) == (60, "length") for n, reason, _ in run(True))


def test_eos_token_has_empty_text() -> None:
    engine, clock, recorder = make_engine()
    r = request("r", 4, max_tokens=10)
    engine.add_request(r)
    r.eos_at = 3
    run_until_idle(engine, clock)
    assert r.finish_reason is FinishReason.STOP and r.stop_reason is None
    assert recorder.tokens[-1].token_id == EOS_TOKEN_ID and recorder.tokens[-1].text == ""


def test_stop_string_finishes_with_stop_reason() -> None:
    third = token_text(sample_token(3, 2))
    engine, clock, _ = make_engine()
    r = request("r", 4, max_tokens=10, seed=3, stop=(third,))
    engine.add_request(r)
    run_until_idle(engine, clock)
    first_two = "".join(token_text(sample_token(3, i)) for i in range(2))
    expected = 3 if third not in first_two else None
    if expected is not None:
        assert r.num_output_tokens == 3
    assert r.finish_reason is FinishReason.STOP and r.stop_reason == third


def test_chunked_prefill_respects_token_budget() -> None:
    engine, clock, _ = make_engine(dataclasses.replace(TEST_PROFILE, max_num_batched_tokens=8))
    engine.add_request(request("r", 20, max_tokens=2))
    durations, first_token_step = [], None
    for i in range(4):
        plan, outputs = step(engine, clock)
        durations.append(plan.duration)
        if outputs and first_token_step is None:
            first_token_step = i
    assert first_token_step == 2  # 8 + 8 + 4 prompt tokens
    assert durations[:3] == pytest.approx([A + B + 8 * G, A + B + 8 * G, A + B + 4 * G])


def test_add_request_validates() -> None:
    engine, _, _ = make_engine()
    engine.add_request(request("r", 4, 1))
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request(request("r", 4, 1))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(request("long", 200, 100))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request(request("zero", 4, 0))
