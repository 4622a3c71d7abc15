"""The labelled children the per-request path keeps stay the registry's own series."""

from __future__ import annotations

from fairq_server.telemetry import Telemetry


def test_a_kept_child_is_the_registrys_series() -> None:
    t = Telemetry()
    t.dispatches_of("b1", "standard").inc()
    t.dispatches_of("b1", "standard").inc()
    labels = {"backend": "b1", "tier": "standard"}
    assert t.registry.get_sample_value("fairq_dispatches_total", labels) == 2


def test_a_forgotten_backends_series_comes_back_when_it_is_used_again() -> None:
    t = Telemetry()
    t.dispatches_of("b1", "standard").inc()
    t.in_flight_of("b1").set(3)
    t.forget_backend("b1")
    labels = {"backend": "b1", "tier": "standard"}
    assert t.registry.get_sample_value("fairq_dispatches_total", labels) is None
    t.dispatches_of("b1", "standard").inc()
    t.in_flight_of("b1").set(1)
    assert t.registry.get_sample_value("fairq_dispatches_total", labels) == 1
    assert t.registry.get_sample_value("fairq_backend_in_flight", {"backend": "b1"}) == 1
