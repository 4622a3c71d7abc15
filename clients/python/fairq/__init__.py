"""Python client for fairq, the fair-scheduling gRPC front door for LLM backends.

Typical use::

    import fairq

    async with fairq.AsyncClient("127.0.0.1:50051", user="alice") as client:
        async for event in client.generate("my-model", "Hello", max_tokens=16):
            if isinstance(event, fairq.Chunk):
                print(event.text, end="")

:class:`Client` is the blocking twin. Every gRPC failure is raised as a
:class:`FairqError` (subclassed by status code; the tree is drawn in
``fairq._errors``).
"""

from fairq._async_client import AsyncClient
from fairq._backends import Backend, BackendKind, BackendStatus
from fairq._errors import (
    DeadlineExceededError,
    FairqError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RequestCancelledError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from fairq._events import Chunk, Completion, Event, Finished, Queued, Started
from fairq._requests import ChatMessages
from fairq._snapshot import BackendLoad, ModelQueue, Snapshot, UserLoad
from fairq._sync_client import Client

__all__ = [
    "AsyncClient",
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
    "ModelQueue",
    "NotFoundError",
    "PermissionDeniedError",
    "Queued",
    "RequestCancelledError",
    "ResourceExhaustedError",
    "Snapshot",
    "Started",
    "UnauthenticatedError",
    "UnavailableError",
    "UserLoad",
]
