"""Backends registered over RPC, kept where a restart finds them.

One process keeps them in a JSON file (``state_file``); a cluster keeps them in Redis
(:mod:`fairq_server.cluster.shared_registrations`), where every replica sees them. Either way
``RegisterBackend`` outlives the process that took it. Backends named in the configuration
file are the file's; they are not stored here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from fairq_server.config.schema import BackendConfig, ConfigError

__all__ = ["FileRegistrations", "Registrations", "backend_from_json", "backend_to_json"]

log = logging.getLogger(__name__)


def backend_to_json(cfg: BackendConfig) -> str:
    """Serialise a backend registration (stable key order, so equal means unchanged)."""
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)


def backend_from_json(text: str | bytes) -> BackendConfig:
    """Read a registration written by :func:`backend_to_json`."""
    raw: dict[str, Any] = json.loads(text)
    known = {f.name for f in dataclasses.fields(BackendConfig)}
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known
    }
    try:
        return BackendConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"stored backend registration unreadable: {exc}") from None


class Registrations(Protocol):
    """Where RPC registrations are kept."""

    async def load(self) -> list[BackendConfig]:
        """Return every stored registration."""
        ...

    async def put(self, cfg: BackendConfig) -> None:
        """Store (or replace) a registration."""
        ...

    async def delete(self, backend_id: str) -> None:
        """Forget a registration (no error if unknown)."""
        ...


class FileRegistrations:
    """Registrations in a JSON file, replaced atomically on every change.

    Args:
        path: the ``state_file``; created on the first registration.

    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = asyncio.Lock()

    def _read(self) -> dict[str, str]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
            backends = data["backends"]
            return {b["id"]: json.dumps(b, sort_keys=True) for b in backends}
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"state_file {self.path} is unreadable: {exc}") from None

    def _write(self, entries: dict[str, str]) -> None:
        data = {"backends": [json.loads(v) for _, v in sorted(entries.items())]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)  # a crash leaves the old file or the new, never half

    async def load(self) -> list[BackendConfig]:
        """See :meth:`Registrations.load`."""
        return [backend_from_json(v) for v in self._read().values()]

    async def put(self, cfg: BackendConfig) -> None:
        """See :meth:`Registrations.put`."""
        async with self._lock:
            entries = self._read()
            entries[cfg.id] = backend_to_json(cfg)
            self._write(entries)

    async def delete(self, backend_id: str) -> None:
        """See :meth:`Registrations.delete`."""
        async with self._lock:
            entries = self._read()
            if entries.pop(backend_id, None) is not None:
                self._write(entries)
