"""The OpenAI-compatible HTTP door (chat, completions, models)."""

from fairq_server.doors.http.server import HttpDoor

__all__ = ["HttpDoor"]
