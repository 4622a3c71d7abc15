"""Paged KV cache with a block-hash prefix cache.

The cache is ``num_blocks`` blocks of ``block_size`` tokens. A request holds the blocks for
the tokens it has computed. Once a block is full its content is identified by a chained hash,
``hash(parent_hash, tokens_of_block)``, so equal hashes mean equal prefixes up to and including
that block. When the request finishes its blocks are freed but keep their hashes: a later
request whose prompt starts with the same blocks reuses them and skips their prefill.

Free blocks form one LRU list. Allocation takes the least recently freed block, evicting its
cached content; blocks are freed tail first so a sequence's shared prefix outlives its tail.
A block in use by several requests (a shared prefix) carries a reference count.
"""

from __future__ import annotations

from collections import OrderedDict

from fairq_sim.request import SimRequest

__all__ = ["KvCache"]

_ROOT_HASH = 0x5EED


class KvCache:
    """Block allocator and prefix cache for one engine.

    Args:
        num_blocks: Total blocks.
        block_size: Tokens per block.

    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_count = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any request (cached content included)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, 0 to 1 (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content is registered in the prefix cache."""
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        """Return how many blocks ``num_tokens`` tokens occupy."""
        return -(-num_tokens // self.block_size)

    def find_prefix_hits(self, request: SimRequest) -> list[int]:
        """Return the cached blocks that match the start of ``request``'s tokens.

        At most ``num_tokens - 1`` tokens can hit: the last one must be computed to produce
        the next token's logits.
        """
        max_blocks = (request.num_tokens - 1) // self.block_size
        self._extend_hashes(request, max_blocks)
        hits = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self._cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(
        self, request: SimRequest, num_new_tokens: int, hit_blocks: list[int] | None = None
    ) -> bool:
        """Give ``request`` the blocks it needs to compute ``num_new_tokens`` more tokens.

        Args:
            request: The request; its ``block_ids`` grow.
            num_new_tokens: Tokens to be computed this step.
            hit_blocks: Prefix-cache hits to take first (only for a request holding none).

        Returns:
            False, changing nothing, if there are not enough free blocks.

        """
        hits = hit_blocks or []
        computed = request.num_computed_tokens + len(hits) * self.block_size
        needed = self.blocks_for(computed + num_new_tokens) - len(request.block_ids) - len(hits)
        # Hits sitting in the free list are taken out of it too.
        reclaimed = sum(1 for b in hits if self._ref_count[b] == 0)
        if needed + reclaimed > len(self._free):
            return False
        for block in hits:
            if self._ref_count[block] == 0:
                del self._free[block]
            self._ref_count[block] += 1
        request.block_ids.extend(hits)
        for _ in range(max(needed, 0)):
            block, _ = self._free.popitem(last=False)
            evicted = self._block_hash[block]
            if evicted is not None:
                self._block_hash[block] = None
                if self._cached.get(evicted) == block:
                    del self._cached[evicted]
            self._ref_count[block] = 1
            request.block_ids.append(block)
        return True

    def cache_full_blocks(self, request: SimRequest) -> None:
        """Register every block of ``request`` that is full of computed tokens."""
        full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        self._extend_hashes(request, full)
        for i in range(full):
            block = request.block_ids[i]
            if self._block_hash[block] is not None:
                continue
            block_hash = request.block_hashes[i]
            self._block_hash[block] = block_hash
            # An identical block computed concurrently keeps the first registration.
            self._cached.setdefault(block_hash, block)

    def free(self, request: SimRequest) -> None:
        """Release ``request``'s blocks, tail first, keeping their cached content."""
        for block in reversed(request.block_ids):
            self._ref_count[block] -= 1
            if self._ref_count[block] == 0:
                self._free[block] = None
        request.block_ids.clear()

    def _extend_hashes(self, request: SimRequest, num_blocks: int) -> None:
        hashes = request.block_hashes
        size = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH
            hashes.append(hash((parent, tuple(request.token_ids(i * size, (i + 1) * size)))))
