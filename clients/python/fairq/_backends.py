"""Backend descriptions for the ``Admin`` service, as plain dataclasses.

The backend kinds are those of the proto's ``BackendKind`` enum, read from the
generated module: a kind added to ``admin.proto`` reaches this client when the
stubs are regenerated, with no list here to keep in step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeAlias

from fairq._messages import from_message
from fairq.v1 import admin_pb2

__all__ = ["BACKEND_KINDS", "Backend", "BackendKind", "BackendStatus"]

BackendKind: TypeAlias = str
"""A backend kind's name: its ``BackendKind`` enum name without the prefix, in
lower case (``BACKEND_KIND_OPENAI`` is ``"openai"``); :data:`BACKEND_KINDS` lists them."""

_PREFIX = "BACKEND_KIND_"
# Our name -> the enum's value name (the message takes names), and the enum's number -> our name.
_KIND_TO_PROTO: dict[str, str] = {
    name.removeprefix(_PREFIX).lower(): name
    for name, number in admin_pb2.BackendKind.items()
    if number != admin_pb2.BACKEND_KIND_UNSPECIFIED
}
_KIND_FROM_PROTO: dict[int, str] = {
    admin_pb2.BackendKind.Value(name): kind for kind, name in _KIND_TO_PROTO.items()
}

BACKEND_KINDS: tuple[BackendKind, ...] = tuple(_KIND_TO_PROTO)
"""The inference servers fairq can drive (``"vllm"``, ``"tgi"``, ``"openai"``, ...)."""


@dataclass(frozen=True, slots=True)
class Backend:
    """A registered backend, mirroring ``fairq.v1.Backend``.

    Attributes:
        id: Unique id, e.g. ``"vllm-a"``.
        kind: One of :data:`BACKEND_KINDS`; ``"unspecified"`` for a kind this
            client does not know (a newer server may add kinds).
        base_url: Base URL, e.g. ``"http://127.0.0.1:8000"``.
        models: Models the backend serves.
        priority_scheduling: Whether the backend schedules by vLLM's ``priority``.
        max_in_flight: Cap on requests fairq keeps in flight on it (0 = none).
        fair_share_priority: The priority sent also encodes whether the user
            holds less than a fair share of the backend.
        metrics_preset: ``"openai"`` kind: the metric names' preset, ``"none"``
            for a backend without ``/metrics``, empty for the default.
        waiting_metric: ``"openai"`` kind: the waiting-requests gauge.
        running_metric: ``"openai"`` kind: the running-requests gauge.
        kv_usage_metric: ``"openai"`` kind: the 0-1 KV cache usage gauge.
        tpot_metric: ``"openai"`` kind: the time-per-output-token histogram.
        priority_order: ``"lower-first"`` or ``"higher-first"``; empty for the
            kind's default.
        api_key_env: fairq's environment variable holding the backend's API key.
        preempt: fairq may preempt requests running on it for one that should run
            now (needs ``max_in_flight``, its running slots).

    """

    id: str
    kind: BackendKind
    base_url: str
    models: tuple[str, ...]
    priority_scheduling: bool
    max_in_flight: int
    fair_share_priority: bool = False
    metrics_preset: str = ""
    waiting_metric: str = ""
    running_metric: str = ""
    kv_usage_metric: str = ""
    tpot_metric: str = ""
    priority_order: str = ""
    api_key_env: str = ""
    preempt: bool = False


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
        reason: Why the backend is unhealthy (its last failed check); empty
            when healthy.

    """

    backend: Backend
    healthy: bool
    in_flight: int
    waiting: float
    running: float
    tpot_seconds: float
    draining: bool
    reason: str = ""


def backend_to_proto(backend: Backend) -> admin_pb2.Backend:
    """Build a ``fairq.v1.Backend`` message.

    Raises:
        ValueError: ``backend.kind`` is not one of :data:`BACKEND_KINDS`.

    """
    kind = _KIND_TO_PROTO.get(backend.kind)
    if kind is None:
        valid = ", ".join(BACKEND_KINDS)
        raise ValueError(f"unknown backend kind {backend.kind!r}; valid: {valid}")
    fields = {f.name: getattr(backend, f.name) for f in dataclasses.fields(backend)}
    return admin_pb2.Backend(**{**fields, "kind": kind, "models": list(backend.models)})


def backend_status_from_proto(status: admin_pb2.BackendStatus) -> BackendStatus:
    """Convert a ``fairq.v1.BackendStatus`` message."""
    b = status.backend
    kind = _KIND_FROM_PROTO.get(b.kind, "unspecified")
    backend = from_message(Backend, b, kind=kind, models=tuple(b.models))
    return from_message(BackendStatus, status, backend=backend)
