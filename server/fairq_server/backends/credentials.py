"""What fairq must know before it sends work to a backend: its API key and its models.

A backend started with an API key (``vllm serve --api-key``, ``sglang --api-key``,
``llama-server --api-key``) refuses requests without ``Authorization: Bearer``. The key is
never written in fairq's configuration: it is read from an environment variable or a file
when the backend is registered. Over the Admin API only environment variables whose name
starts with ``FAIRQ_BACKEND_KEY_`` may be named, so an admin call cannot make fairq send
another secret of its environment (``FAIRQ_REDIS_PASSWORD``, a database URL, any file it can
read) to a host of the caller's choosing. Every refusal of such a name gets one and the same
error, so the answer does not tell which variables exist either.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import aiohttp

from fairq_server.backends.http_reading import describe_failure, read_at_most
from fairq_server.errors import BackendError, BackendFailure, InvalidRequestError
from fairq_server.names import escape

if TYPE_CHECKING:
    from fairq_server.config.backends import BackendConfig

__all__ = [
    "RPC_ENV_PREFIX",
    "ListsModels",
    "check_served_models",
    "read_api_key",
    "refuse_unserved",
]

log = logging.getLogger(__name__)

RPC_ENV_PREFIX = "FAIRQ_BACKEND_KEY_"
_MAX_KEY_BYTES = 4096
_MAX_MODELS_BYTES = 1024 * 1024


class ListsModels(Protocol):
    """What the model check needs of a backend adapter (``Backend`` offers it)."""

    @property
    def id(self) -> str:
        """The backend's id."""
        ...

    @property
    def base_url(self) -> str:
        """The backend's URL."""
        ...

    @property
    def models(self) -> Sequence[str]:
        """The models registered for it."""
        ...

    def session(self) -> aiohttp.ClientSession:
        """Return the backend's connection pool, with its credentials."""
        ...

    async def verify_models(self, timeout: float = 5.0) -> None:
        """Check ``/v1/models`` (see :func:`check_served_models`)."""
        ...

    async def aclose(self) -> None:
        """Close the backend's connections."""
        ...


def read_api_key(cfg: BackendConfig, *, from_rpc: bool = False) -> str | None:
    """Return the backend's API key from ``api_key_env`` or ``api_key_file``, if configured.

    Raises:
        InvalidRequestError: both or an unusable source is named, the variable is unset, the
            file unreadable, or the key empty, too long or not printable ASCII.

    """
    if cfg.api_key_env and cfg.api_key_file:
        raise InvalidRequestError(f"backend {cfg.id}: set api_key_env or api_key_file, not both")
    if cfg.api_key_file:
        if from_rpc:
            raise InvalidRequestError("api_key_file can only be set in the configuration file")
        try:
            with open(cfg.api_key_file, "rb") as f:
                raw = f.read(_MAX_KEY_BYTES + 1)
        except OSError as exc:
            raise InvalidRequestError(
                f"backend {cfg.id}: cannot read api_key_file: {exc.strerror}"
            ) from None
        key = raw.decode("ascii", "replace").splitlines()[0] if raw.strip() else ""
        source = f"api_key_file {cfg.api_key_file}"
    elif cfg.api_key_env:
        if from_rpc:
            return _rpc_key(cfg.api_key_env)
        value = os.environ.get(cfg.api_key_env)
        if value is None:
            raise InvalidRequestError(
                f"backend {cfg.id}: environment variable {cfg.api_key_env} is not set"
            )
        key, source = value, f"environment variable {cfg.api_key_env}"
    else:
        return None
    key = key.strip()
    if not _valid_key(key):
        raise InvalidRequestError(
            f"backend {cfg.id}: the key in {source} must be 1-{_MAX_KEY_BYTES} printable "
            "ASCII characters"
        )
    return key


def _valid_key(key: str) -> bool:
    return 0 < len(key) <= _MAX_KEY_BYTES and all(0x21 <= ord(c) < 0x7F for c in key)


def _rpc_key(name: str) -> str:
    """Return the key in variable ``name``, named over the Admin API.

    A name outside the prefix, an unset variable and an unusable value get the same error:
    which variables exist in fairq's environment is none of an admin caller's business.
    """
    value = os.environ.get(name) if name.startswith(RPC_ENV_PREFIX) else None
    key = (value or "").strip()
    if not _valid_key(key):
        raise InvalidRequestError(
            f"api_key_env set over the Admin API must name a set environment variable "
            f"starting with {RPC_ENV_PREFIX} holding 1-{_MAX_KEY_BYTES} printable ASCII "
            "characters"
        )
    return key


async def check_served_models(backend: ListsModels, timeout: float) -> dict[str, int]:
    """Ask ``/v1/models`` and compare it with ``backend.models``.

    Returns the context length of each registered model the list gives one for (vLLM's
    ``max_model_len``); empty when the list was not read.

    Only a conclusive answer counts: a model list without a registered model refuses the
    backend, a refused API key keeps it unverified. Anything else (no such endpoint, an
    error status, an answer that is not a model list: TGI before 2.0, test servers) is
    logged and the registration is trusted, since the check is a safeguard, not a
    condition for serving.

    Raises:
        InvalidRequestError: some registered model is not listed (the message names both).
        BackendError: unreachable, or the backend refused fairq's credentials (a timeout
            is not conclusive: logged and trusted).

    """
    url = f"{backend.base_url}/v1/models"
    try:
        async with backend.session().get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body, complete = await read_at_most(resp, _MAX_MODELS_BYTES)
            if not complete:
                resp.close()  # the rest is never read; the connection goes with it
    except TimeoutError:
        log.warning("backend %s: /v1/models did not answer; its models are not checked", backend.id)
        return {}
    except aiohttp.ClientError as exc:
        raise BackendError(
            f"backend {backend.id}: cannot list models at {escape(url, 300)}: "
            f"{describe_failure(exc)}",
            BackendFailure.UNAVAILABLE,
        ) from exc
    if resp.status in (401, 403):
        raise BackendError(
            f"backend {backend.id} refused fairq's credentials at /v1/models (HTTP "
            f"{resp.status}): set api_key_env or api_key_file to the backend's API key",
            BackendFailure.UNAVAILABLE,
        )
    listing = None
    if resp.status == 200 and complete:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        listing = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(listing, list):
        log.warning(
            "backend %s: /v1/models gave no model list (HTTP %d); its models are not checked",
            backend.id,
            resp.status,
        )
        return {}
    served = {str(m["id"]) for m in listing if isinstance(m, dict) and "id" in m}
    missing = [m for m in backend.models if m not in served]
    if missing:
        listed = escape(", ".join(sorted(served)[:20]), 1000) or "none"
        raise InvalidRequestError(
            f"backend {backend.id} does not serve {escape(', '.join(missing), 1000)} (its "
            f"/v1/models "
            f"lists: {listed})"
        )
    return {
        str(m["id"]): m["max_model_len"]
        for m in listing
        if isinstance(m, dict)
        and m.get("id") in backend.models
        and isinstance(m.get("max_model_len"), int)
        and not isinstance(m["max_model_len"], bool)
        and m["max_model_len"] > 0
    }


async def refuse_unserved(backend: ListsModels) -> None:
    """Check a backend registered over the Admin API before it is accepted.

    A backend that answers and does not serve its models is refused (and its connections
    closed). One that cannot be asked now is accepted: its scrapes repeat the check, and it
    stays unhealthy, with the reason, until the check passes.

    Raises:
        InvalidRequestError: the backend does not serve a registered model.

    """
    try:
        await backend.verify_models()
    except BackendError:
        return
    except InvalidRequestError:
        await backend.aclose()
        raise
