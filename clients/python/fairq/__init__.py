"""Python client for fairq, the fair-scheduling gRPC front door for LLM backends.

Typical use::

    import fairq

    async with fairq.AsyncClient("127.0.0.1:50051", user="alice") as client:
        async for event in client.generate("my-model", "Hello", max_tokens=16):
            if isinstance(event, fairq.Chunk):
                print(event.text, end="")

:class:`Client` is the blocking twin; both are built on one base
(``fairq._base_client``). Every gRPC failure is raised as a
:class:`FairqError`, subclassed by status code, the transient ones under
:class:`RetryableError` (the tree is drawn in ``fairq._errors``).
"""

from fairq._async_client import AsyncClient
from fairq._backends import BACKEND_KINDS, Backend, BackendKind, BackendStatus
from fairq._entitlement import AuditEntry, Limit, Team
from fairq._errors import (
    DeadlineExceededError,
    FairqError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RequestCancelledError,
    ResourceExhaustedError,
    RetryableError,
    UnauthenticatedError,
    UnavailableError,
)
from fairq._events import Chunk, Completion, Event, Finished, Queued, Started
from fairq._json import JsonValue
from fairq._requests import ChatMessages
from fairq._snapshot import BackendLoad, ModelQueue, Snapshot, UserLoad
from fairq._sync_client import Client

__all__ = [
    "BACKEND_KINDS",
    "AsyncClient",
    "AuditEntry",
    "Backend",
    "BackendKind",
    "BackendLoad",
    "BackendStatus",
    "ChatMessages",
    "Chunk",
    "Client",
    "Completion",
    "DeadlineExceededError",
    "Event",
    "FairqError",
    "Finished",
    "InvalidArgumentError",
    "JsonValue",
    "Limit",
    "ModelQueue",
    "NotFoundError",
    "PermissionDeniedError",
    "Queued",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "RetryableError",
    "Snapshot",
    "Started",
    "Team",
    "UnauthenticatedError",
    "UnavailableError",
    "UserLoad",
]
