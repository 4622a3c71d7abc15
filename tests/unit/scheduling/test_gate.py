"""Gate decisions: waiting estimate, thresholds per tier, TPOT, KV, staleness."""

from __future__ import annotations

import pytest

from fairq_server.backends.request import MetricsSample
from fairq_server.backends.vllm import VllmBackend
from fairq_server.config.schema import TierConfig
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.gate import GateOutcome, ThresholdGate, estimated_waiting
from fairq_server.scheduling.prefix import PrefixCache

INTERACTIVE = TierConfig("interactive", max_backend_waiting=3)
BATCH = TierConfig("batch", max_backend_waiting=0)
NOW = 100.0


def state(max_in_flight: int = 0) -> BackendState:
    backend = VllmBackend("b", "http://127.0.0.1:9", ["m"], max_in_flight=max_in_flight)
    return BackendState(backend, PrefixCache(16))


def load(
    waiting: float = 0,
    *,
    taken_at: float = NOW,
    running: float = 0,
    kv_usage: float | None = None,
    tpot_seconds: float | None = None,
    max_in_flight: int = 0,
    **kw: object,
) -> BackendState:
    s = state(max_in_flight)
    s.sample = MetricsSample(waiting=waiting, running=running, kv_usage=kv_usage)
    s.sampled_at = taken_at
    s.tpot_seconds = tpot_seconds
    for key, value in kw.items():
        setattr(s, key, value)
    return s


def admit(backend: BackendState, tier: TierConfig, now: float, stale_after: float) -> GateOutcome:
    return ThresholdGate().check(backend, tier, now, stale_after)


def test_missing_metrics_fail_closed() -> None:
    assert admit(state(), INTERACTIVE, NOW, 1.0) is GateOutcome.NO_METRICS


def test_stale_metrics_fail_closed() -> None:
    assert admit(load(0, taken_at=NOW - 1.5), INTERACTIVE, NOW, 1.0) is GateOutcome.STALE
    assert admit(load(0, taken_at=NOW - 0.5), INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT


@pytest.mark.parametrize(("waiting", "expected"), [(0, True), (2, True), (3, False), (7, False)])
def test_interactive_admits_below_threshold(waiting: int, expected: bool) -> None:
    outcome = admit(load(waiting), INTERACTIVE, NOW, 1.0)
    assert (outcome is GateOutcome.ADMIT) is expected
    if not expected:
        assert outcome is GateOutcome.WAITING


def test_batch_only_when_backend_queue_is_empty() -> None:
    assert admit(load(0), BATCH, NOW, 1.0) is GateOutcome.ADMIT
    assert admit(load(1), BATCH, NOW, 1.0) is GateOutcome.WAITING


def test_our_tokenless_requests_count_as_waiting_live() -> None:
    """Sent since the scrape and no token yet: waiting (or on the way), whatever the scrape
    said; a first token moves a request to running at once, without waiting for a scrape."""
    st = load(0)
    st.awaiting_first_token = 2  # two requests sent since the scrape (mark 0)
    assert estimated_waiting(st) == 2
    st.awaiting_first_token = 3
    assert admit(st, INTERACTIVE, NOW, 1.0) is GateOutcome.WAITING
    st.awaiting_first_token = 2  # one produced its first token: the backend started it
    assert admit(st, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT


def test_other_clients_waiting_requests_come_from_the_scrape() -> None:
    """The scraped count minus what was ours then is other clients' queue; ours is live."""
    st = load(5)
    st.sample = MetricsSample(waiting=5, running=4)
    st.awaiting_mark = 3
    st.awaiting_first_token = 3
    assert estimated_waiting(st) == 5  # 2 of others + our 3
    st.awaiting_first_token = 0  # ours all started since
    assert estimated_waiting(st) == 2
    assert admit(st, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
    assert admit(st, BATCH, NOW, 1.0) is GateOutcome.WAITING


def test_estimate_never_negative() -> None:
    """A request of ours that started between sending the scrape and the backend answering
    it is in the mark but not in the scraped count."""
    st = load(0)
    st.sample = MetricsSample(waiting=1, running=4)
    st.awaiting_mark = 3
    assert estimated_waiting(st) == 0


def test_tpot_over_limit_holds() -> None:
    assert admit(load(0, tpot_seconds=0.2), INTERACTIVE, NOW, 1.0) is GateOutcome.TPOT
    assert admit(load(0, tpot_seconds=0.1), INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
    no_limit = TierConfig("x", tpot_limit_seconds=None)
    assert admit(load(0, tpot_seconds=9.0), no_limit, NOW, 1.0) is GateOutcome.ADMIT


def test_kv_usage_limit() -> None:
    tier = TierConfig("x", kv_usage_limit=0.9)
    assert admit(load(0, kv_usage=0.95), tier, NOW, 1.0) is GateOutcome.KV_CACHE
    assert admit(load(0, kv_usage=0.5), tier, NOW, 1.0) is GateOutcome.ADMIT


def test_in_flight_cap_and_draining() -> None:
    assert (
        admit(load(0, in_flight=4, max_in_flight=4), INTERACTIVE, NOW, 1.0) is GateOutcome.IN_FLIGHT
    )
    assert admit(load(0, draining=True), INTERACTIVE, NOW, 1.0) is GateOutcome.DRAINING


def test_tier_in_flight_cap_keeps_slots_for_higher_tiers() -> None:
    batch = TierConfig("batch", max_backend_waiting=0, max_in_flight=3)
    st = load(0)
    st.tier_in_flight = {"batch": 3, "interactive": 1}
    assert admit(st, batch, NOW, 1.0) is GateOutcome.TIER_IN_FLIGHT
    assert admit(st, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
    st.tier_in_flight["batch"] = 2
    assert admit(st, batch, NOW, 1.0) is GateOutcome.ADMIT


def test_backend_in_flight_bound_reserves_the_remaining_slots_for_higher_tiers() -> None:
    """Batch goes only while fewer than 12 requests of any tier are in flight; interactive,
    without the bound, may take the 4 slots that leaves."""
    batch = TierConfig("batch", max_backend_waiting=0, max_backend_in_flight=12)
    st = load(0, in_flight=12)
    st.tier_in_flight = {"interactive": 2, "batch": 10}
    assert admit(st, batch, NOW, 1.0) is GateOutcome.RESERVED
    assert admit(st, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
    st.in_flight = 11
    assert admit(st, batch, NOW, 1.0) is GateOutcome.ADMIT
