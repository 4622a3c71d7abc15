"""KV cache, waiting queues and tokenisation on their own."""

from __future__ import annotations

import pytest

from fairq_sim import SimRequest
from fairq_sim.kv_cache import KvCache
from fairq_sim.tokens import (
    BOS_TOKEN_ID,
    count_tokens,
    eos_position,
    render_chat,
    tokenize,
)
from fairq_sim.waiting_queue import FcfsQueue, PriorityQueue, create_waiting_queue


def req(
    rid: str, tokens: list[int], priority: int = 0, arrival: float = 0.0, seq: int = 0
) -> SimRequest:
    r = SimRequest(rid, tokens, 4, priority=priority)
    r.arrival_time, r.arrival_seq = arrival, seq
    return r


def test_allocate_free_and_usage() -> None:
    kv = KvCache(num_blocks=10, block_size=4)
    r = req("r", list(range(10)))
    assert kv.allocate(r, 10)
    assert len(r.block_ids) == 3 and kv.num_free_blocks == 7
    assert kv.usage == pytest.approx(0.3)
    r.num_computed_tokens = 10
    assert kv.allocate(r, 2)  # 12 tokens still fit 3 blocks
    assert len(r.block_ids) == 3
    assert not kv.allocate(r, 40)  # refused without side effects
    assert len(r.block_ids) == 3
    kv.free(r)
    assert kv.num_free_blocks == 10 and kv.usage == 0.0


def test_cached_blocks_are_shared_with_reference_counts() -> None:
    kv = KvCache(num_blocks=10, block_size=4)
    a = req("a", list(range(9)))
    assert kv.allocate(a, 9)
    a.num_computed_tokens = 9
    kv.cache_full_blocks(a)
    assert kv.num_cached_blocks == 2
    b = req("b", [*range(8), 99, 98])
    hits = kv.find_prefix_hits(b)
    assert hits == a.block_ids[:2]
    assert kv.allocate(b, 2, hits)
    assert b.block_ids[:2] == a.block_ids[:2]
    kv.free(a)
    assert kv.num_free_blocks == 10 - 3  # shared blocks stay held by b
    kv.free(b)
    assert kv.num_free_blocks == 10


def test_chained_hashes_depend_on_the_whole_prefix() -> None:
    kv = KvCache(num_blocks=10, block_size=2)
    x = req("x", [1, 2, 3, 4, 5])
    y = req("y", [9, 9, 3, 4, 5])
    kv.find_prefix_hits(x)
    kv.find_prefix_hits(y)
    assert x.block_hashes[1] != y.block_hashes[1]


@pytest.mark.parametrize("factory", [FcfsQueue, PriorityQueue])
def test_queue_contract(factory: type[FcfsQueue] | type[PriorityQueue]) -> None:
    q = factory()
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(IndexError):
        q.peek()
    a, b, c = req("a", [1], seq=0), req("b", [1], seq=1), req("c", [1], seq=2)
    for r in (a, b, c):
        q.add(r)
    assert len(q) == 3 and [r.request_id for r in q] == ["a", "b", "c"]
    q.remove(b)
    assert [r.request_id for r in q] == ["a", "c"]
    with pytest.raises(ValueError):
        q.remove(b)
    assert q.peek() is a and q.pop() is a and q.pop() is c and len(q) == 0


def test_fcfs_prepend_puts_preempted_first() -> None:
    q = FcfsQueue()
    q.add(req("a", [1], seq=0))
    q.prepend(req("p", [1], seq=5))
    assert [r.request_id for r in q] == ["p", "a"]


def test_priority_queue_key_priority_then_arrival_then_sequence() -> None:
    q = PriorityQueue()
    q.add(req("late-high", [1], priority=0, arrival=2.0, seq=3))
    q.add(req("low", [1], priority=3, arrival=0.0, seq=0))
    q.add(req("early-high-2", [1], priority=0, arrival=1.0, seq=2))
    q.add(req("early-high-1", [1], priority=0, arrival=1.0, seq=1))
    q.prepend(req("preempted", [1], priority=0, arrival=0.5, seq=9))
    assert [q.pop().request_id for _ in range(5)] == [
        "preempted",
        "early-high-1",
        "early-high-2",
        "late-high",
        "low",
    ]


def test_unknown_policy_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="fcfs, priority"):
        create_waiting_queue("edf")


def test_tokenize_four_bytes_per_token_plus_bos() -> None:
    assert tokenize("") == [BOS_TOKEN_ID]
    assert len(tokenize("Hello, world")) == 4  # BOS + 12 bytes / 4
    assert len(tokenize("Hello, world!")) == 5
    assert count_tokens("Hello, world!") == 5
    assert count_tokens("héllo") == len(tokenize("héllo"))
    assert tokenize("same prefix, A")[:3] == tokenize("same prefix, B")[:3]


def test_render_chat_accepts_text_parts() -> None:
    text = render_chat(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        ]
    )
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"


def test_eos_position_is_geometric_with_the_given_mean() -> None:
    positions = [eos_position(seed, 50.0) for seed in range(4000)]
    assert min(positions) >= 1
    assert sum(positions) / len(positions) == pytest.approx(50, rel=0.08)
    assert eos_position(1, 1.0) == 1
