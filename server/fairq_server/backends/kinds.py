"""The backend kinds fairq speaks: the one table of their names and adapters."""

from __future__ import annotations

from collections.abc import Mapping

from fairq_server.backends.base import Backend
from fairq_server.backends.openai import OpenAIBackend
from fairq_server.backends.tgi import TgiBackend
from fairq_server.backends.vllm import VllmBackend

__all__ = ["BACKEND_KINDS"]

BACKEND_KINDS: Mapping[str, type[Backend]] = {
    "vllm": VllmBackend,
    "tgi": TgiBackend,
    "openai": OpenAIBackend,
}
