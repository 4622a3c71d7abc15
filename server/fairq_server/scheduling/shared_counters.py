"""The dispatcher's side of the cluster's events: shared counters and the peers' view.

The cluster's sync task asks for the journals (:class:`~.events.TakeJournals`), flushes them
to Redis and posts the shared counters back (:class:`~.events.FairnessSync`); its refresher
posts what the other replicas hold on each backend (:class:`~.events.PeerView`). All are
applied here, in the dispatcher loop, the only writer of the counters and backend states. Any
fairness policy takes part: the counters are the tier queue's, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from fairq_server.scheduling import events as ev
from fairq_server.scheduling.backend_set import BackendSet
from fairq_server.scheduling.model_state import ModelState
from fairq_server.scheduling.queue import TierQueue

__all__ = ["BandOf", "apply_cluster_event", "take_journals"]


#: For a model's tier, which of this replica's entries wait in the idle-only band (None: no one).
BandOf = Callable[[str, TierQueue], Callable[[str], bool] | None]


def take_journals(models: Iterable[ModelState], band: BandOf) -> list[ev.JournalEntry]:
    """Swap every shared tier's journal for a fresh one; return the old ones."""
    out = []
    for model in models:
        for index, tier in enumerate(model.queue.tiers):
            taken = tier.counters.take_journal(band(model.name, tier))
            if taken is not None:
                journal, active, heads, members = taken
                out.append(ev.JournalEntry(model.name, index, journal, active, heads, members))
    return out


def apply_cluster_event(
    event: ev.PeerView | ev.TakeJournals | ev.FairnessSync,
    models: Mapping[str, ModelState],
    backends: BackendSet,
    now: float,
    band: BandOf,
) -> None:
    """Apply one of the cluster's events (a tier or backend that is gone: ignored)."""
    match event:
        case ev.PeerView(backend_id, awaiting, in_flight, share):
            if (state := backends.get(backend_id)) is not None:
                state.peer_view(awaiting, in_flight, share, now)
        case ev.TakeJournals(done):
            if not done.done():
                done.set_result(take_journals(models.values(), band))
        case ev.FairnessSync(model_name, tier, counters, heads):
            model = models.get(model_name)
            if model is not None and tier < len(model.queue.tiers):
                model.queue.tiers[tier].counters.adopt(counters, heads)
