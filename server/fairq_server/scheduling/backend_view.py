"""A backend's state read into a :class:`~fairq_server.scheduling.queue_view.BackendView`."""

from __future__ import annotations

from fairq_server.backends.openai import OpenAIBackend
from fairq_server.scheduling.backend_state import BackendState
from fairq_server.scheduling.queue_view import BackendView

__all__ = ["view_of"]


def view_of(state: BackendState, stale_after: float, now: float) -> BackendView:
    """Return ``state`` as plain values.

    ``healthy`` is what admin.proto promises: the last scrape succeeded and its snapshot is
    fresh by the gate's own measure (at most ``stale_after`` seconds old at ``now``), so a
    backend the gate refuses as stale is not listed as healthy.
    """
    b, sample = state.backend, state.sample
    fresh = sample is not None and now - state.sampled_at <= stale_after
    return BackendView(
        id=b.id,
        kind=b.kind,
        base_url=b.base_url,
        models=tuple(b.models),
        priority_scheduling=b.priority_scheduling,
        fair_share_priority=b.fair_share_priority,
        max_in_flight=b.max_in_flight,
        preempt=b.preempt,
        settings=_settings(b),
        reason=state.reason[:1000],
        healthy=state.healthy is True and fresh,
        in_flight=state.in_flight,
        waiting=sample.waiting if sample else 0.0,
        running=sample.running if sample else 0.0,
        tpot_seconds=state.tpot_seconds or 0.0,
        draining=state.draining,
    )


def _settings(backend: object) -> dict[str, str]:
    """Return the OpenAI kind's metric mapping and priority order, as registered."""
    if not isinstance(backend, OpenAIBackend):
        return {}
    m = backend.metrics
    tpot = m.tpot_sum and f"{m.tpot_sum}/{m.tpot_count}"
    return {
        "waiting_metric": m.waiting,
        "running_metric": m.running,
        "kv_usage_metric": m.kv_usage,
        "tpot_metric": tpot,
        "priority_order": backend.priority_order,
        "metrics_preset": "" if m.scrape else "none",
    }
