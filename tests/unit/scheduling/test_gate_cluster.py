"""The gate in a cluster: other replicas' requests count, and the local share when alone."""

from __future__ import annotations

from fairq_server.backends.request import MetricsSample
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


def test_losing_the_shared_gate_keeps_the_peers_counts_until_a_newer_scrape_shows_them() -> None:
    """The last sample was taken with the other replicas' requests marked as fairq's, so
    until a scrape sent after the loss lands they would vanish from the estimate."""
    backend = load(2, awaiting_first_token=0, peer_awaiting=2, peer_in_flight=3, awaiting_mark=2)
    assert estimated_waiting(backend) == 2
    backend.peer_view(0, 0, 0.5, now=NOW + 1)  # Redis lost: on the local share
    assert (backend.peer_awaiting, backend.share) == (2, 0.5)
    assert estimated_waiting(backend) == 2  # not 0: the two waiting are the peers'
    backend.peer_view(0, 0, 0.5, now=NOW + 1.5)  # the same view again changes nothing
    assert backend.peer_awaiting == 2
    backend.scrape_sent(NOW + 2)
    assert backend._sent_mark == 0  # the peers' requests are other clients' in this one
    backend.scrape_landed(MetricsSample(waiting=2, running=8), unhealthy_after=3)
    assert (backend.peer_awaiting, backend.peer_in_flight) == (0, 0)
    assert estimated_waiting(backend) == 2  # now from the scrape
    backend.peer_view(1, 4, 1.0, now=NOW + 3)  # back on the shared gate
    assert (backend.peer_awaiting, backend.peer_in_flight, backend.share) == (1, 4, 1.0)


def test_a_scrape_sent_before_the_loss_does_not_end_the_wait() -> None:
    backend = load(2, peer_awaiting=2, awaiting_mark=2)
    backend.scrape_sent(NOW)
    backend.peer_view(0, 0, 0.5, now=NOW + 1)
    backend.scrape_landed(MetricsSample(waiting=2, running=8), unhealthy_after=3)
    assert backend.peer_awaiting == 2
