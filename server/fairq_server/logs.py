"""fairq's log format: one event per line, whatever callers and backends put in a message."""

from __future__ import annotations

import logging

from fairq_server.names import escape

__all__ = ["FORMAT", "OneLineFormatter", "configure"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class OneLineFormatter(logging.Formatter):
    """Escapes control characters in the message, so no text can start a forged line.

    Values from callers and backends are escaped where they enter a message already; this
    is the backstop for any that slips through. A traceback (``exc_info``) is appended after
    the escaped message and keeps its own lines.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """Format ``record`` with its message escaped (see :func:`fairq_server.names.escape`)."""
        record.message = escape(record.message, limit=16_384)
        return super().formatMessage(record)


def configure(level: str) -> None:
    """Log to stderr at ``level`` through :class:`OneLineFormatter`."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # The store's migration library logs a line per plugin and per migration context at INFO:
    # noise beside fairq's own line naming the store it opened.
    logging.getLogger("alembic").setLevel(logging.WARNING)
