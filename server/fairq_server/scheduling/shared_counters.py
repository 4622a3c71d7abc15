"""The dispatcher's side of shared fairness counters (cluster only).

The cluster's sync task asks for the journals (:class:`~.events.TakeJournals`), flushes them
to Redis and posts the shared counters back (:class:`~.events.FairnessSync`); both are
applied here, in the dispatcher loop, the only writer of the policies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fairq_server.scheduling import events as ev
from fairq_server.scheduling.fairness.counter import CounterFairness
from fairq_server.scheduling.model_state import ModelState

__all__ = ["adopt_counters", "take_journals"]


def take_journals(models: Iterable[ModelState]) -> list[ev.JournalEntry]:
    """Swap every counter policy's journal for a fresh one; return the old ones."""
    out = []
    for model in models:
        for index, tier in enumerate(model.queue.tiers):
            fairness = tier.fairness
            if isinstance(fairness, CounterFairness):
                journal, active, heads = fairness.take_journal()
                out.append(ev.JournalEntry(model.name, index, journal, active, heads))
    return out


def adopt_counters(models: Mapping[str, ModelState], sync: ev.FairnessSync) -> None:
    """Apply shared counters to one tier's policy (ignored if it is gone)."""
    model = models.get(sync.model)
    if model is None or sync.tier >= len(model.queue.tiers):
        return
    fairness = model.queue.tiers[sync.tier].fairness
    if isinstance(fairness, CounterFairness):
        fairness.adopt(sync.counters, sync.heads)
