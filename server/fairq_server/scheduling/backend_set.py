"""The registered backends, by id and by the models they serve (the dispatcher's to write)."""

from __future__ import annotations

from fairq_server.scheduling.backend_state import BackendState

__all__ = ["BackendSet"]


class BackendSet:
    """Registered backends: lookup by id, and which serve each model."""

    def __init__(self) -> None:
        self._by_id: dict[str, BackendState] = {}
        self._by_model: dict[str, list[BackendState]] = {}

    def get(self, backend_id: str) -> BackendState | None:
        """Return the state of ``backend_id``, if registered."""
        return self._by_id.get(backend_id)

    def all(self) -> list[BackendState]:
        """Return every registered backend."""
        return list(self._by_id.values())

    def of(self, model: str) -> list[BackendState]:
        """Return the registered backends serving ``model``."""
        return self._by_model.get(model, [])

    def models(self) -> set[str]:
        """Return every model some registered backend serves."""
        return set(self._by_model)

    def add(self, state: BackendState) -> BackendState | None:
        """Register ``state``; return the one it replaces (same id), now draining."""
        old = self.drop(state.id)
        self._by_id[state.id] = state
        for model in state.backend.models:
            self._by_model.setdefault(model, []).append(state)
        return old

    def drop(self, backend_id: str) -> BackendState | None:
        """Unregister ``backend_id``; it drains (finishes what it runs, takes nothing new)."""
        state = self._by_id.pop(backend_id, None)
        if state is None:
            return None
        state.draining = True
        for model in state.backend.models:
            serving = [b for b in self._by_model.get(model, []) if b is not state]
            if serving:
                self._by_model[model] = serving
            else:
                self._by_model.pop(model, None)
        return state
