"""Prompt-prefix hashing and per-backend memory of recently served prefixes.

A prompt is cut into fixed-size blocks of *characters* and each block's hash is chained with
the previous one, so hash i identifies the whole prefix up to block i. Characters rather than
tokens because fairq has no tokenizer for the backend's model (and must not need one): two
prompts that share a textual prefix share their leading character blocks exactly, which is all
grouping needs; the backend's own KV blocks are then shared too, up to the last partial block.

Chat messages are hashed over a role-tagged serialisation, so equal system prompts group. A
prompt given as token ids is cut into blocks of ``block_chars / 4`` ids (the ~4 characters per
token of :mod:`fairq_server.doors.estimate`), so its blocks cover about as much of the prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PrefixCache", "prefix_hashes"]


def prefix_hashes(
    prompt: str | None,
    messages: Sequence[tuple[str, str]] | None,
    block_chars: int,
    max_blocks: int = 256,
    token_ids: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """Return the chained block hashes of the prompt's complete leading blocks.

    Only complete blocks count (a trailing partial block is unique to the request anyway),
    and at most ``max_blocks`` so a huge prompt costs bounded work. ``token_ids``, if given,
    is the prompt (as token ids) instead of ``prompt``.
    """
    if token_ids is not None:
        size = max(1, block_chars // 4)
        count = min(len(token_ids) // size, max_blocks)
        chain = []
        acc = 0
        for i in range(count):
            # Tagged, so a block of ids never hashes like a block of text.
            acc = hash((acc, "ids", tuple(token_ids[i * size : (i + 1) * size])))
            chain.append(acc)
        return tuple(chain)
    if messages is not None:
        text = "".join(f"\x1e{role}\x1f{content}" for role, content in messages)
    else:
        text = prompt or ""
    blocks = min(len(text) // block_chars, max_blocks)
    hashes = []
    h = 0
    for i in range(blocks):
        # Python's str hash is salted per process; these hashes never leave the process.
        h = hash((h, text[i * block_chars : (i + 1) * block_chars]))
        hashes.append(h)
    return tuple(hashes)


class PrefixCache:
    """An LRU set of prefix-block hashes a backend has recently been sent.

    It approximates what the backend's own prefix cache holds: recently sent prefixes are
    likely still cached there, old ones have likely been evicted.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: Sequence[int]) -> int:
        """Return how many leading blocks of ``hashes`` are remembered."""
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        """Remember ``hashes`` as the most recently used prefix."""
        lru = self._lru
        # Tail first, so the leading blocks end most recent and are evicted last: only leading
        # blocks can match, and a chain that lost its head is dead weight (the backend's own
        # cache also frees a request's blocks tail first).
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)
