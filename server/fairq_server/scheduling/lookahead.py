"""Lookahead: a slot about to free is filled a moment before it does.

Where fairq caps a backend at its slots (``max_in_flight``), nothing waits in the engine's own
queue, so each time a request ends its slot stands empty until fairq hears of the end, picks
the next request and the engine admits it: a few milliseconds a request, which on a fast
engine (a step of 1.6 ms, a short answer of 48 tokens) is several per cent of throughput.
A request's end is known ahead when its caller set ``max_tokens`` (and the engine ignores EOS,
or the answer runs to the bound): once the request has :data:`LOOKAHEAD_TOKENS` or fewer left,
its slot counts as free (:attr:`BackendState.finishing`), so the next request is chosen and
sent then and waits in the engine's queue for those few steps instead of the slot waiting for
it. The stream reader tells the dispatcher at once when a request crosses that line (between
its batched charges). Tokens, not seconds: fairq's own round trip is what must be covered,
and a few engine steps cover it on any engine (26 ms on the tiny CPU model, about 0.2 s on a
GPU 8B model); the choice is made that much early, nothing else. At most :data:`MAX_AHEAD`
slot per backend counts free this way at a time, so a backend never holds more than one
request beyond its ``max_in_flight``; when that request's predecessor ends, the next running
request near its end may take the turn.

Not for a slot that will be held for its own user (:mod:`.anticipation`): that slot waits for
the user's next request. A request that ends early (an EOS before its bound) frees its slot
as before, when fairq hears of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairq_server.scheduling.backend_state import BackendState
    from fairq_server.scheduling.ticket import Ticket

__all__ = ["LOOKAHEAD_TOKENS", "MAX_AHEAD", "near_end"]

#: A request with this many tokens or fewer left by its ``max_tokens`` frees its slot early.
LOOKAHEAD_TOKENS = 16
#: Slots per backend counted free ahead of their end at a time (requests beyond the cap).
MAX_AHEAD = 1


def near_end(ticket: Ticket, backend: BackendState) -> bool:
    """Whether running ``ticket`` is within the lookahead of its ``max_tokens``."""
    if not ticket.max_tokens or not backend.max_in_flight:
        return False
    return ticket.max_tokens - ticket.charged_completion <= LOOKAHEAD_TOKENS
