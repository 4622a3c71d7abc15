"""The clients' methods, declared once: arguments in, a description of the call out.

Each function here is one public method of both :class:`fairq.Client` and
:class:`fairq.AsyncClient`, with its signature and docstring: it checks the
arguments, builds the request and names how to convert the answer. The two
clients run the description, blocking or awaited (``fairq._base_client``
binds them); so the requests, the conversions and the errors are the same in
both by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from fairq._backends import (
    Backend,
    BackendKind,
    BackendStatus,
    backend_status_from_proto,
    backend_to_proto,
)
from fairq._json import JsonValue, struct_from_json
from fairq._requests import ChatMessages, build_sampling, set_input
from fairq._snapshot import Snapshot, snapshot_from_proto
from fairq.v1 import admin_pb2, scheduler_pb2

__all__: list[str] = []

_T = TypeVar("_T")

AdminRpc: TypeAlias = Literal[
    "RegisterBackend", "DeregisterBackend", "ListBackends", "GetQueueSnapshot",
    "SetTeam", "DeleteTeam", "ListTeams", "SetLimit", "DeleteLimit", "ListLimits",
    "ListAuditLog",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class StreamCall:
    """A ``Scheduler/Generate`` call to make."""

    request: scheduler_pb2.GenerateRequest
    timeout: float | None


@dataclass(frozen=True, slots=True)
class UnaryCall(Generic[_T]):
    """An ``Admin`` call to make: the method's name, its request, and the answer's conversion."""

    rpc: AdminRpc
    request: Any
    convert: Callable[[Any], _T]
    timeout: float | None


def generate(
    model: str,
    prompt: str | Sequence[int] | None = None,
    *,
    messages: ChatMessages | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    stop: Sequence[str] = (),
    seed: int | None = None,
    ignore_eos: bool = False,
    tier: str = "",
    request_id: str = "",
    extra: Mapping[str, JsonValue] | None = None,
    timeout: float | None = None,
) -> StreamCall:
    """Submit one request and stream its lifecycle events.

    The call starts when iteration starts. Leaving the iteration early
    cancels it on the server, which frees the request's queue slot or aborts
    its backend stream: at once with ``close()`` (``aclose()`` for the async
    client, or ``contextlib.aclosing``), and when the generator is
    garbage-collected after a plain ``break``.

    Args:
        model: Model name, as registered by a backend.
        prompt: Plain-text prompt (completions API), or the prompt as token
            ids of the model's tokenizer (for engines that take them: vLLM and
            the ``openai`` kind; the server refuses them for TGI).
        messages: Chat messages as ``(role, content)`` pairs or mappings with
            ``role`` and ``content`` keys. Exactly one of ``prompt`` and
            ``messages`` must be given.
        max_tokens: Upper bound on generated tokens (> 0).
        temperature: Sampling temperature, 0 to 2.
        top_p: Nucleus sampling mass, in (0, 1].
        stop: Up to 4 stop strings.
        seed: Sampling seed.
        ignore_eos: Keep generating past end-of-sequence (vLLM only).
        tier: Requested tier, e.g. ``"batch"``; empty means the caller's
            highest allowed tier. It may be lower than that, never higher.
        request_id: Caller-chosen id for logs; fairq makes one if empty.
        extra: Backend parameters passed through unchanged (the request's
            ``extra``): for OpenAI-compatible backends e.g. ``tools``,
            ``tool_choice``, ``response_format``, ``logprobs``, ``top_k``; for
            a TGI prompt request, TGI's ``parameters``. Keys fairq sets
            itself, and the sampling fields above, are refused by the server.
            What the backend returns beside text (tool calls, logprobs)
            arrives in :attr:`Chunk.extra`.
        timeout: Deadline for the whole stream in seconds, time queued
            included; ``None`` for none. It is sent as the gRPC deadline,
            so the server also learns it and can drop a queued request
            whose caller has given up (which ``asyncio.timeout`` cannot).

    Unset sampling parameters take the backend's defaults.

    Returns:
        A generator (an async one from :class:`AsyncClient`) of
        :class:`Queued`, :class:`Started`, :class:`Chunk` and :class:`Finished`
        events.

    Raises:
        ValueError: Neither or both of ``prompt`` and ``messages``, or an
            integer in ``extra`` a JSON double cannot hold (raised here,
            before any call).
        TypeError: ``stop`` or ``messages`` is a plain string, or ``extra``
            holds something that is not JSON (likewise).
        FairqError: From the iteration, when the call fails.

    """
    optional = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    request = scheduler_pb2.GenerateRequest(
        model=model,
        sampling=build_sampling(stop, ignore_eos, optional),
        tier=tier,
        request_id=request_id,
    )
    set_input(request, prompt, messages)
    if extra is not None:
        request.extra.CopyFrom(struct_from_json(extra, "extra"))
    return StreamCall(request, timeout)


COMPLETE_DOC = """Run one request to the end and return the collected :class:`Completion`.

Takes the same arguments as :meth:`generate`.

Raises:
    ValueError: As :meth:`generate`.
    TypeError: As :meth:`generate`.
    FairqError: The call failed.

"""


def register_backend(
    id: str,
    kind: BackendKind,
    base_url: str,
    models: Sequence[str],
    *,
    priority_scheduling: bool = False,
    max_in_flight: int = 0,
    fair_share_priority: bool = False,
    metrics_preset: str = "",
    waiting_metric: str = "",
    running_metric: str = "",
    kv_usage_metric: str = "",
    tpot_metric: str = "",
    priority_order: str = "",
    api_key_env: str = "",
    preempt: bool = False,
    timeout: float | None = None,
) -> UnaryCall[BackendStatus]:
    """Register a backend, or replace the one with the same id (admin only).

    Args:
        id: Unique backend id, e.g. ``"vllm-a"``.
        kind: One of :data:`fairq.BACKEND_KINDS`, e.g. ``"vllm"``, ``"tgi"``
            or ``"openai"`` (any OpenAI-compatible server: SGLang, llama.cpp).
        base_url: Base URL, e.g. ``"http://127.0.0.1:8000"``.
        models: Models the backend serves.
        priority_scheduling: The backend schedules by vLLM's ``priority``
            (``--scheduling-policy priority``); fairq cannot detect this.
        max_in_flight: Cap on requests fairq keeps in flight on it (0 = none);
            required for a backend without a waiting metric.
        fair_share_priority: With ``priority_scheduling``, the priority sent
            also encodes whether the user holds less than a fair share.
        metrics_preset: ``"openai"`` kind: ``"sglang"``, ``"llamacpp"`` or
            ``"none"`` (no ``/metrics``).
        waiting_metric: ``"openai"`` kind: sample name overriding the preset's.
        running_metric: Likewise.
        kv_usage_metric: Likewise (a 0-1 gauge).
        tpot_metric: Likewise (a histogram name, or ``"sum_name/count_name"``).
        priority_order: ``"lower-first"`` or ``"higher-first"``; empty for the
            kind's default.
        api_key_env: fairq's environment variable holding the backend's API
            key (over this API the name must start with ``FAIRQ_``).
        preempt: fairq may preempt requests running on the backend for one
            that should run now (a tier's ``preempt_after_seconds``); needs
            ``max_in_flight``, the backend's running slots.
        timeout: Deadline for the call in seconds.

    Returns:
        The backend's status right after registration.

    Raises:
        ValueError: Unknown ``kind``.
        TypeError: ``models`` is a plain string.
        FairqError: The call failed, e.g. ``PermissionDeniedError``.

    """
    backend = Backend(
        id=id,
        kind=kind,
        base_url=base_url,
        models=_model_names(models),
        priority_scheduling=priority_scheduling,
        max_in_flight=max_in_flight,
        fair_share_priority=fair_share_priority,
        metrics_preset=metrics_preset,
        waiting_metric=waiting_metric,
        running_metric=running_metric,
        kv_usage_metric=kv_usage_metric,
        tpot_metric=tpot_metric,
        priority_order=priority_order,
        api_key_env=api_key_env,
        preempt=preempt,
    )
    request = admin_pb2.RegisterBackendRequest(backend=backend_to_proto(backend))
    return UnaryCall("RegisterBackend", request, _registered_status, timeout)


def _model_names(models: Sequence[str]) -> tuple[str, ...]:
    # A str is a Sequence[str]: it would register one model per character.
    if isinstance(models, str):
        raise TypeError("models must be a sequence of model names, not a str")
    return tuple(models)


def _registered_status(response: admin_pb2.RegisterBackendResponse) -> BackendStatus:
    return backend_status_from_proto(response.status)


def deregister_backend(
    id: str, *, drain: bool = False, timeout: float | None = None
) -> UnaryCall[None]:
    """Remove a backend (admin only).

    Args:
        id: The backend's id.
        drain: Stop sending it new work and return only once its in-flight
            requests have finished.
        timeout: Deadline for the call in seconds (draining included).

    Raises:
        FairqError: The call failed, e.g. ``NotFoundError`` for an unknown id.

    """
    request = admin_pb2.DeregisterBackendRequest(id=id, drain=drain)
    return UnaryCall("DeregisterBackend", request, _nothing, timeout)


def _nothing(response: admin_pb2.DeregisterBackendResponse) -> None:
    return None


def queue_snapshot(*, top_users: int = 0, timeout: float | None = None) -> UnaryCall[Snapshot]:
    """Report queue depth per model and tier, top users and backend gates (admin only).

    Args:
        top_users: How many users to list (0: the server's default, 10;
            at most 1000).
        timeout: Deadline for the call in seconds.

    Raises:
        ValueError: ``top_users`` is negative.
        FairqError: The call failed.

    """
    if top_users < 0:
        raise ValueError("top_users must be 0 or more")
    request = admin_pb2.GetQueueSnapshotRequest(top_users=top_users)
    return UnaryCall("GetQueueSnapshot", request, snapshot_from_proto, timeout)


def list_backends(*, timeout: float | None = None) -> UnaryCall[list[BackendStatus]]:
    """Report every registered backend and its live state (admin only).

    Args:
        timeout: Deadline for the call in seconds.

    Raises:
        FairqError: The call failed.

    """
    return UnaryCall("ListBackends", admin_pb2.ListBackendsRequest(), _statuses, timeout)


def _statuses(response: admin_pb2.ListBackendsResponse) -> list[BackendStatus]:
    return [backend_status_from_proto(status) for status in response.backends]
