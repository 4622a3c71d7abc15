"""The request log of both doors: one JSON line per finished request (opt-in), recent tokens.

Enabled with ``access_log = true`` in the configuration (or ``fairq serve --access-log``).
Lines go to standard output through the ``fairq.access`` logger, apart from fairq's own log
on standard error, so a log shipper can parse them without filtering. Fields::

    {"ts": "2026-12-01T04:10:39.123Z", "request_id": "...", "user_group": "default",
     "tier": "interactive", "model": "sim", "backend": "vllm-a", "outcome": "finished",
     "queue_seconds": 0.012, "ttft_seconds": 0.051, "total_seconds": 1.2,
     "prompt_tokens": 12, "completion_tokens": 64}

``outcome`` is ``finished``, ``cancelled`` or the gRPC status name in lower case (as in
``fairq_requests_total``), for HTTP requests too. Timing fields the request never reached
are ``null``; ``backend`` is ``""`` when it was never dispatched; token counts are the
backend's, 0 for a request that did not finish. User names are not logged (only the group),
as in the
metrics: the log is often kept longer and wider than the key file.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from fairq_server.observe.recent import RecentService
from fairq_server.scheduling.outbox import Finished, OutboxEvent, Relayed, Started, Text
from fairq_server.store.records import UsageRecord

__all__ = [
    "ACCESS_LOGGER",
    "RequestLog",
    "RequestTrace",
    "UsageSink",
    "configure_access_log",
    "format_line",
    "usage_record",
]

ACCESS_LOGGER = "fairq.access"


@dataclass
class RequestTrace:
    """What one ``Generate`` call did, filled in as it goes.

    Times are ``time.monotonic()`` values; ``None`` until reached.
    """

    request_id: str = ""
    user: str = ""
    group: str = ""
    team: str | None = None
    tier: str = ""
    model: str = ""
    arrival: float = 0.0
    backend: str = ""
    started_at: float | None = None
    first_token_at: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def observe(self, event: OutboxEvent, now: float) -> None:
        """Record what an event sent to the client says (started, first text, finished)."""
        if isinstance(event, Started):  # again after a retry: the backend that serves
            self.backend = event.backend_id
            self.started_at = self.arrival + event.queue_seconds
        elif isinstance(event, Text | Relayed):
            if self.first_token_at is None:
                self.first_token_at = now
        elif isinstance(event, Finished):
            self.prompt_tokens = event.prompt_tokens
            self.completion_tokens = event.completion_tokens
            self.first_token_at = self.arrival + event.ttft_seconds


def _seconds(start: float, end: float | None) -> float | None:
    return None if end is None else round(end - start, 6)


def format_line(trace: RequestTrace, outcome: str, ended_at: float, wall: float) -> str:
    """Return the JSON access-log line of ``trace``, ended with ``outcome`` at ``ended_at``.

    Args:
        trace: the request's trace.
        outcome: ``finished``, ``cancelled`` or a lower-case gRPC status name.
        ended_at: monotonic time the call ended.
        wall: Unix time the call ended (the line's timestamp).

    """
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"
    return json.dumps(
        {
            "ts": stamp,
            "request_id": trace.request_id,
            "user_group": trace.group,
            "tier": trace.tier,
            "model": trace.model,
            "backend": trace.backend,
            "outcome": outcome,
            "queue_seconds": _seconds(trace.arrival, trace.started_at),
            "ttft_seconds": _seconds(trace.arrival, trace.first_token_at),
            "total_seconds": _seconds(trace.arrival, ended_at),
            "prompt_tokens": trace.prompt_tokens,
            "completion_tokens": trace.completion_tokens,
        },
        separators=(", ", ": "),
        # ASCII only: a raw U+2028 in a model name would split the line for some readers.
        ensure_ascii=True,
    )


class UsageSink(Protocol):
    """Where a request's usage row goes when it ends (the usage ledger)."""

    def record(self, entry: UsageRecord) -> None:
        """Take one row; must not block or raise (the request path calls it)."""
        ...


def usage_record(trace: RequestTrace, outcome: str, ended_at: float, wall: float) -> UsageRecord:
    """Return the usage ledger's row for ``trace``, ended with ``outcome`` at ``ended_at``."""
    return UsageRecord(
        ended_at=wall,
        request_id=trace.request_id,
        user=trace.user,
        team=trace.team,
        model=trace.model,
        backend=trace.backend,
        tier=trace.tier,
        input_tokens=trace.prompt_tokens,
        output_tokens=trace.completion_tokens,
        queue_seconds=_seconds(trace.arrival, trace.started_at),
        ttft_seconds=_seconds(trace.arrival, trace.first_token_at),
        outcome=outcome,
    )


def configure_access_log(enabled: bool) -> logging.Logger:
    """Set the ``fairq.access`` logger up: on, to standard output, or off.

    Idempotent, so a configuration reload may call it again.
    """
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.propagate = False  # not into fairq's own log on stderr
    for handler in list(logger.handlers):
        if getattr(handler, "_fairq_access", False):
            logger.removeHandler(handler)
    if enabled:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._fairq_access = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    else:
        logger.setLevel(logging.CRITICAL + 1)
    return logger


class RequestLog:
    """Where a finished call is reported: recent service, the access log, the usage ledger.

    Attributes:
        recent: tokens served per user, for ``GetQueueSnapshot``.
        enabled: write the JSON access-log line.
        usage: the usage ledger, told of every request that reached the queue (None: none).

    """

    def __init__(
        self,
        enabled: bool = False,
        recent: RecentService | None = None,
        usage: UsageSink | None = None,
    ) -> None:
        self.recent = recent if recent is not None else RecentService()
        self.enabled = enabled
        self.usage = usage
        self._logger = configure_access_log(enabled)

    def set_enabled(self, enabled: bool) -> None:
        """Turn the access log on or off (configuration reload)."""
        self.enabled = enabled
        self._logger = configure_access_log(enabled)

    def finished(self, trace: RequestTrace, outcome: str) -> None:
        """Report a call that ended with ``outcome``.

        A failed write (closed stdout) is reported by ``logging`` itself, never raised.
        """
        ended_at, wall = time.monotonic(), time.time()
        if trace.user:
            self.recent.record(trace.user, trace.prompt_tokens + trace.completion_tokens)
            if self.usage is not None:  # a request refused before its queue has no user
                self.usage.record(usage_record(trace, outcome, ended_at, wall))
        if self.enabled:
            self._logger.info(format_line(trace, outcome, ended_at, wall))
