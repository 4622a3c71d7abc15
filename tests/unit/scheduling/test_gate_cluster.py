"""The gate in a cluster: other replicas' requests count, and the local share when alone."""

from __future__ import annotations

from fairq_server.scheduling.gate import GateOutcome, estimated_waiting

from .test_gate import INTERACTIVE, NOW, admit, load


def test_other_replicas_tokenless_requests_fill_the_threshold() -> None:
    backend = load(0, awaiting_first_token=1, peer_awaiting=1)
    assert estimated_waiting(backend) == 2
    assert admit(backend, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
    backend.peer_awaiting = 2
    assert admit(backend, INTERACTIVE, NOW, 1.0) is GateOutcome.WAITING


def test_the_scrape_mark_counts_every_replicas_requests() -> None:
    backend = load(0, awaiting_first_token=1, peer_awaiting=2)
    backend.scrape_sent(NOW)
    assert backend._sent_mark == 3  # the scraped queue holds the other replicas' requests too


def test_in_flight_cap_is_shared() -> None:
    backend = load(0, max_in_flight=4, in_flight=2, peer_in_flight=2)
    assert admit(backend, INTERACTIVE, NOW, 1.0) is GateOutcome.IN_FLIGHT


def test_local_share_scales_threshold_and_cap_but_never_below_one() -> None:
    third = load(0, awaiting_first_token=1, share=1 / 3)
    assert admit(third, INTERACTIVE, NOW, 1.0) is GateOutcome.WAITING  # 3 * 1/3 = 1
    third.awaiting_first_token = 0
    assert admit(third, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
    half_cap = load(0, max_in_flight=4, in_flight=2, share=0.5)
    assert admit(half_cap, INTERACTIVE, NOW, 1.0) is GateOutcome.IN_FLIGHT
    tiny = load(0, share=0.01)
    assert admit(tiny, INTERACTIVE, NOW, 1.0) is GateOutcome.ADMIT
