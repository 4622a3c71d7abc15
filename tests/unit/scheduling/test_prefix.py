"""Prefix hashing (chained character blocks) and the per-backend LRU of served prefixes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairq_server.scheduling.prefix import PrefixCache, prefix_hashes

B = 8  # block size in characters; small so that examples stay readable


# -- prefix_hashes ------------------------------------------------------------------------


def test_equal_prefixes_give_equal_leading_hashes_and_then_diverge() -> None:
    shared = "S" * (2 * B)
    a = prefix_hashes(shared + "a" * B, None, B)
    b = prefix_hashes(shared + "b" * B, None, B)
    assert len(a) == len(b) == 3
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_hashes_are_chained_so_equal_blocks_after_different_prefixes_differ() -> None:
    # Block 2 has the same text in both prompts; its hash must still identify the whole prefix.
    a = prefix_hashes("x" * B + "same" * 2, None, B)
    b = prefix_hashes("y" * B + "same" * 2, None, B)
    assert a[0] != b[0]
    assert a[1] != b[1]


def test_a_difference_inside_the_first_block_changes_every_hash() -> None:
    a = prefix_hashes("A" + "z" * (4 * B - 1), None, B)
    b = prefix_hashes("B" + "z" * (4 * B - 1), None, B)
    assert not set(a) & set(b)


def test_only_complete_blocks_count() -> None:
    assert prefix_hashes("q" * (B - 1), None, B) == ()
    assert prefix_hashes("", None, B) == ()
    assert prefix_hashes(None, None, B) == ()
    two = prefix_hashes("q" * (2 * B), None, B)
    assert len(two) == 2
    # A trailing partial block neither adds a hash nor changes the complete ones.
    for tail in ("r", "r" * (B - 1)):
        assert prefix_hashes("q" * (2 * B) + tail, None, B) == two


def test_max_blocks_bounds_the_work_and_keeps_the_leading_hashes() -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(100 * B))
    full = prefix_hashes(text, None, B, max_blocks=1000)
    assert len(full) == 100
    capped = prefix_hashes(text, None, B, max_blocks=8)
    assert capped == full[:8]
    assert prefix_hashes(text, None, B) == full  # default bound (256) is above 100 blocks


def test_same_input_gives_same_hashes_within_a_process() -> None:
    text = "deterministic " * 10
    assert prefix_hashes(text, None, B) == prefix_hashes(text, None, B)


def test_equal_system_prompts_group_across_chats() -> None:
    system = ("system", "You are a helpful assistant. " * 4)
    a = prefix_hashes(None, [system, ("user", "What is 2+2?" * 3)], B)
    b = prefix_hashes(None, [system, ("user", "Name a prime." * 3)], B)
    # The serialised system message is a separator, the role, a separator and the content;
    # every block that lies entirely inside it is shared, and the user messages then diverge.
    shared_blocks = (1 + len("system") + 1 + len(system[1])) // B
    assert shared_blocks >= 10
    assert a[:shared_blocks] == b[:shared_blocks]
    assert a[-1] != b[-1]


def test_chat_roles_are_part_of_the_hashed_text() -> None:
    content = "c" * (4 * B)
    as_system = prefix_hashes(None, [("system", content)], B)
    as_user = prefix_hashes(None, [("user", content)], B)
    assert as_system[0] != as_user[0]
    # A chat never groups with a plain prompt that happens to equal its concatenated text.
    assert prefix_hashes(content, None, B)[0] not in as_user


def test_message_boundaries_are_tagged() -> None:
    # Same concatenated content, different split between messages: different requests.
    a = prefix_hashes(None, [("user", "ab" * B), ("user", "cd" * B)], B)
    b = prefix_hashes(None, [("user", "ab" * B + "c"), ("user", "d" + "cd" * (B - 1))], B)
    assert a != b


def test_messages_win_over_prompt() -> None:
    msgs = [("user", "m" * (3 * B))]
    assert prefix_hashes("p" * (3 * B), msgs, B) == prefix_hashes(None, msgs, B)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@settings(max_examples=200, deadline=None)
@given(
    shared=st.text(alphabet="ab", max_size=6 * B),
    a=st.text(alphabet="ab", max_size=6 * B),
    b=st.text(alphabet="ab", max_size=6 * B),
    max_blocks=st.integers(1, 16),
)
def test_leading_equal_hashes_are_exactly_the_complete_shared_blocks(
    shared: str, a: str, b: str, max_blocks: int
) -> None:
    """Property: #equal leading hashes == min(common prefix // B, blocks of each, max_blocks).

    (Barring a 64-bit hash collision, which a two-letter alphabet over short texts won't hit.)
    """
    x, y = shared + a, shared + b
    hx = prefix_hashes(x, None, B, max_blocks)
    hy = prefix_hashes(y, None, B, max_blocks)
    assert len(hx) == min(len(x) // B, max_blocks)
    equal = 0
    for p, q in zip(hx, hy, strict=False):
        if p != q:
            break
        equal += 1
    assert equal == min(_common_prefix(x, y) // B, len(hx), len(hy))


# -- PrefixCache --------------------------------------------------------------------------


def test_match_counts_remembered_leading_blocks_only() -> None:
    cache = PrefixCache(capacity=100)
    assert cache.match((1, 2, 3)) == 0
    cache.add((1, 2, 3))
    assert cache.match((1, 2, 3)) == 3
    assert cache.match((1, 2, 3, 4)) == 3
    assert cache.match((1, 2, 9)) == 2
    assert cache.match((9, 2, 3)) == 0  # a miss stops the count even if later blocks are known
    assert cache.match(()) == 0
    assert len(cache) == 3


def test_adding_a_shared_prefix_twice_stores_it_once() -> None:
    cache = PrefixCache(capacity=100)
    cache.add((1, 2, 3))
    cache.add((1, 2, 4))
    assert len(cache) == 4
    assert cache.match((1, 2, 4)) == 3


def test_capacity_bounds_the_number_of_remembered_blocks() -> None:
    cache = PrefixCache(capacity=5)
    for start in range(0, 40, 4):
        cache.add(tuple(range(start, start + 4)))
        assert len(cache) <= 5
    assert len(cache) == 5
    # The most recent chain is fully remembered.
    assert cache.match((36, 37, 38, 39)) == 4


def test_least_recently_added_chain_is_evicted_first() -> None:
    cache = PrefixCache(capacity=4)
    cache.add((1, 2))
    cache.add((3, 4))
    cache.add((1, 2))  # refreshes chain (1, 2): now (3, 4) is the least recent
    cache.add((5, 6))
    assert cache.match((1, 2)) == 2
    assert cache.match((5, 6)) == 2
    assert cache.match((3, 4)) == 0
    assert cache.match((4,)) == 0


def test_match_does_not_refresh_recency() -> None:
    # Only a dispatch (add) means the backend saw the prefix again; asking does not.
    cache = PrefixCache(capacity=4)
    cache.add((1, 2))
    cache.add((3, 4))
    assert cache.match((1, 2)) == 2
    cache.add((5, 6))
    assert cache.match((1, 2)) == 0
    assert cache.match((3, 4)) == 2


def test_a_partly_evicted_chain_keeps_its_leading_blocks() -> None:
    # Only leading blocks can ever match, so a chain must lose its tail first: a backend's
    # own prefix cache frees a finished request's blocks tail first for the same reason.
    cache = PrefixCache(capacity=4)
    cache.add((1, 2, 3))
    cache.add((7,))
    cache.add((8,))  # one block over capacity: a block of (1, 2, 3) must go
    assert len(cache) == 4
    assert cache.match((1, 2, 3)) == 2


def test_a_shared_head_outlives_the_tails_that_use_it() -> None:
    cache = PrefixCache(capacity=4)
    cache.add((1, 2, 3))
    cache.add((1, 2, 4))
    cache.add((9,))  # evicts one block: the old tail 3, never the shared head
    assert cache.match((1, 2, 4)) == 3
    assert cache.match((1, 2, 3)) == 2
    cache.add((10,))  # next to go is tail 4
    assert cache.match((1, 2, 4)) == 2
    assert cache.match((1,)) == 1


def test_token_id_prompts_group_by_their_leading_ids() -> None:
    # 16-character blocks are 4-id blocks.
    a = prefix_hashes(None, None, 16, token_ids=list(range(10)))
    b = prefix_hashes(None, None, 16, token_ids=[*range(8), 99, 98, 97, 96])
    assert len(a) == 2 and len(b) == 3
    assert a == b[:2]
    assert prefix_hashes(None, None, 16, token_ids=[9, *range(1, 10)])[0] != a[0]
    # Ids are not text: the ids of "0123" do not group with the text "0123".
    assert (
        prefix_hashes("0123" * 4, None, 16)[0]
        != prefix_hashes(None, None, 16, token_ids=[0, 1, 2, 3])[0]
    )
