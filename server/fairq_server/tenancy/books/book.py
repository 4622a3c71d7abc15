"""The limit book: counters of what each team and user was granted, per window.

Quotas (tokens per minute, tokens per day, requests per minute) and budgets (cost per day or
per month) are one mechanism: a :class:`LimitKey` names a counter (whose, which model, what is
measured, over which window) and the book grants against it. One process keeps the counters
in memory; replicas of a cluster keep them in Redis, so a limit holds whatever the replica
count. Both implement :class:`LimitBook`.

The life of one request's claim:

1. :meth:`LimitBook.reserve` at dispatch, with the amounts the request may use at most
   (prompt estimate plus ``max_tokens`` for tokens, 1 for requests, their price for cost).
   The grant is all or nothing over the request's keys: it is refused if any key's used
   amount already reached its limit, so what is granted in any window stays within the
   limit plus one request's amount, however many replicas reserve at once.
2. :meth:`LimitBook.settle` when the request ends, with what it really used (the backend's
   usage); a request that used less gives the difference back in the window it was granted
   in. A request that never reached a backend is settled with zero.

Rolling windows (``minute``) count by the second in which an amount was granted; calendar
windows (``day``, ``month``) are UTC periods.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Claim",
    "Grant",
    "LimitBook",
    "LimitKey",
    "LimitUse",
    "Measure",
    "Refusal",
    "Scope",
    "Window",
]


class Scope(enum.Enum):
    """Whose usage a counter holds."""

    TEAM = "team"
    USER = "user"


class Measure(enum.Enum):
    """What a counter counts."""

    TOKENS = "tokens"  # input plus output tokens, from the backend's usage
    REQUESTS = "requests"
    COST = "cost"  # in the units of [prices.<model>]


class Window(enum.Enum):
    """The period a counter sums over."""

    MINUTE = "minute"  # rolling: the last 60 seconds
    DAY = "day"  # calendar day, UTC
    MONTH = "month"  # calendar month, UTC


@dataclass(frozen=True)
class LimitKey:
    """One counter: ``subject``'s usage of ``model`` (None: every model), per window.

    Subjects are stored verbatim; implementations must keep any two distinct keys apart
    whatever characters a name holds.
    """

    scope: Scope
    subject: str
    model: str | None
    measure: Measure
    window: Window

    def __hash__(self) -> int:
        # Keys are hashed on every reservation, and enum members hash in Python: the hash is
        # computed once per key object (equality is the dataclass's, field by field).
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.scope, self.subject, self.model, self.measure, self.window))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, object]:
        # A string's hash differs between processes: a pickled key does not carry it.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class LimitUse:
    """One key of a reservation: the amount asked and the limit it must stay within."""

    key: LimitKey
    amount: float
    limit: float


@dataclass(frozen=True)
class Grant:
    """A reservation that was granted; give it back to :meth:`LimitBook.settle`.

    Attributes:
        token: the implementation's handle (which window slot each amount went to).
        uses: what was reserved.
        used: each key's used amount after the grant, in the order of ``uses``.

    """

    token: object
    uses: tuple[LimitUse, ...]
    used: tuple[float, ...]


@dataclass(frozen=True)
class Refusal:
    """A reservation that was refused: the key whose limit is reached, and when to retry.

    Attributes:
        use: the first key found at or above its limit.
        used: that key's used amount.
        retry_after: seconds until enough of the window has passed for the amount to fit
            (rolling windows), or until the calendar period ends.

    """

    use: LimitUse
    used: float
    retry_after: float


class LimitBook(Protocol):
    """Grants amounts against limits, one process or shared by replicas."""

    async def reserve(self, uses: Sequence[LimitUse], now: float) -> Grant | Refusal:
        """Grant every use, or none; ``now`` is wall-clock seconds (time.time())."""
        ...

    async def settle(self, grant: Grant, actual: Sequence[float]) -> None:
        """Replace each reserved amount by the actual one (same order as ``grant.uses``)."""
        ...

    async def used(self, keys: Sequence[LimitKey], now: float) -> list[float]:
        """Return each key's used amount in its current window.

        For reports, gauges and the soft band's check.
        """
        ...


@dataclass(frozen=True)
class Claim:
    """What a dispatched request holds in the book until it is settled."""

    grant: Grant
    model: str
