"""Backend descriptions for the ``Admin`` service, as plain dataclasses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from fairq.v1 import admin_pb2

__all__ = ["Backend", "BackendKind", "BackendStatus"]

BackendKind: TypeAlias = Literal["vllm", "tgi"]
"""The inference servers fairq can drive."""

_KIND_TO_PROTO: dict[str, admin_pb2.BackendKind] = {
    "vllm": admin_pb2.BACKEND_KIND_VLLM,
    "tgi": admin_pb2.BACKEND_KIND_TGI,
}
_KIND_FROM_PROTO: dict[admin_pb2.BackendKind, str] = {
    value: name for name, value in _KIND_TO_PROTO.items()
}


@dataclass(frozen=True, slots=True)
class Backend:
    """A registered backend, mirroring ``fairq.v1.Backend``.

    Attributes:
        id: Unique id, e.g. ``"vllm-a"``.
        kind: ``"vllm"`` or ``"tgi"``; ``"unspecified"`` for a kind this client
            does not know (a newer server may add kinds).
        base_url: Base URL, e.g. ``"http://127.0.0.1:8000"``.
        models: Models the backend serves.
        priority_scheduling: Whether the backend schedules by vLLM's ``priority``.
        max_in_flight: Cap on requests fairq keeps in flight on it (0 = none).

    """

    id: str
    kind: str
    base_url: str
    models: tuple[str, ...]
    priority_scheduling: bool
    max_in_flight: int


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """A backend and its live state, mirroring ``fairq.v1.BackendStatus``.

    Attributes:
        backend: The registration.
        healthy: Whether the last metrics scrape succeeded and is fresh.
        in_flight: Requests fairq has in flight on it.
        waiting: Last scraped number of waiting requests.
        running: Last scraped number of running requests.
        tpot_seconds: Time per output token over the last window (0 if unknown).
        draining: True while draining after ``deregister_backend(drain=True)``.

    """

    backend: Backend
    healthy: bool
    in_flight: int
    waiting: float
    running: float
    tpot_seconds: float
    draining: bool


def build_backend(
    id: str,
    kind: BackendKind,
    base_url: str,
    models: Sequence[str],
    *,
    priority_scheduling: bool,
    max_in_flight: int,
) -> admin_pb2.Backend:
    """Build a ``fairq.v1.Backend`` message.

    Raises:
        ValueError: ``kind`` is not a known backend kind.
        TypeError: ``models`` is a plain string.

    """
    if kind not in _KIND_TO_PROTO:
        raise ValueError(f"unknown backend kind {kind!r}; valid: {', '.join(_KIND_TO_PROTO)}")
    # A str is a Sequence[str]: it would register one model per character.
    if isinstance(models, str):
        raise TypeError("models must be a sequence of model names, not a str")
    return admin_pb2.Backend(
        id=id,
        kind=_KIND_TO_PROTO[kind],
        base_url=base_url,
        models=list(models),
        priority_scheduling=priority_scheduling,
        max_in_flight=max_in_flight,
    )


def backend_status_from_proto(status: admin_pb2.BackendStatus) -> BackendStatus:
    """Convert a ``fairq.v1.BackendStatus`` message."""
    b = status.backend
    return BackendStatus(
        backend=Backend(
            id=b.id,
            kind=_KIND_FROM_PROTO.get(b.kind, "unspecified"),
            base_url=b.base_url,
            models=tuple(b.models),
            priority_scheduling=b.priority_scheduling,
            max_in_flight=b.max_in_flight,
        ),
        healthy=status.healthy,
        in_flight=status.in_flight,
        waiting=status.waiting,
        running=status.running,
        tpot_seconds=status.tpot_seconds,
        draining=status.draining,
    )
