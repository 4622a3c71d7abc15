"""Pins fairq's public names, as httpx's tests/test_exported_members.py does."""

from __future__ import annotations

import importlib
import types

import pytest

import fairq

PUBLIC_API = [
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


def test_all_imports_are_exported() -> None:
    # Submodules (fairq.v1, fairq.client) appear as attributes once imported;
    # they are namespaces, not members.
    members = [
        name
        for name, value in vars(fairq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    ]
    # The order is ruff's (RUF022: constants, then classes, then the rest).
    assert sorted(fairq.__all__) == sorted(members)


def test_public_api_is_pinned() -> None:
    # Removing or renaming a name breaks callers: change this list deliberately.
    assert fairq.__all__ == PUBLIC_API


@pytest.mark.parametrize(
    "module_name",
    [
        "fairq._async_client",
        "fairq._backends",
        "fairq._base_client",
        "fairq._calls",
        "fairq._errors",
        "fairq._events",
        "fairq._json",
        "fairq._messages",
        "fairq._requests",
        "fairq._snapshot",
        "fairq._sync_client",
        "fairq.client",
    ],
)
def test_module_exports_are_reexported(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) <= set(fairq.__all__)
    for name in module.__all__:
        assert getattr(fairq, name) is getattr(module, name)
