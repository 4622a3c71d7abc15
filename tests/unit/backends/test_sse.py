"""SSE framing: events split across reads, batching per read, quirks of real servers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from fairq_server.backends.sse import MAX_EVENT_CHARS, SseLimitError, aiter_sse_batches


async def feed(*chunks: str) -> AsyncIterator[str]:
    for chunk in chunks:
        yield chunk


async def batches(*chunks: str, max_chars: int = MAX_EVENT_CHARS) -> list[list[str]]:
    return [b async for b in aiter_sse_batches(feed(*chunks), max_chars)]


class Endless:
    """An endless stream: ``head``, then ``piece`` forever; counts the chunks taken."""

    def __init__(self, head: str, piece: str) -> None:
        self.head, self.piece, self.taken = head, piece, 0

    async def __aiter__(self) -> AsyncIterator[str]:
        yield self.head
        while True:
            self.taken += 1
            yield self.piece


async def test_events_of_one_read_arrive_together() -> None:
    assert await batches("data: a\n\ndata: b\n\n", "data: c\n\n") == [["a", "b"], ["c"]]


async def test_event_split_across_reads() -> None:
    assert await batches("da", 'ta: {"x"', ": 1}\n", "\n") == [['{"x": 1}']]


async def test_crlf_comments_and_missing_space() -> None:
    text = ":\r\n\r\ndata:{}\r\n\r\nevent: x\r\nid: 3\r\ndata: y\r\n\r\n"
    assert await batches(text) == [["{}", "y"]]


async def test_multi_line_data_and_unterminated_final_event() -> None:
    assert await batches("data: a\ndata: b\n\ndata: tail") == [["a\nb"], ["tail"]]


async def test_unicode_line_separators_stay_inside_data() -> None:
    assert await batches("data: a\u2028b\x0bc\n\n") == [["a\u2028b\x0bc"]]


def test_the_default_limit_is_one_mebibyte() -> None:
    assert MAX_EVENT_CHARS == 1024 * 1024


async def test_an_endless_line_is_refused_once_it_passes_the_limit() -> None:
    """A backend that never sends a newline: refused after the limit, not read forever."""
    stream = Endless('data: {"choices": [{"text": "', "x" * 65536)
    got: list[list[str]] = []
    with pytest.raises(SseLimitError) as info:
        async for batch in aiter_sse_batches(stream.__aiter__()):
            got.append(batch)
    assert info.value.limit == MAX_EVENT_CHARS
    assert str(MAX_EVENT_CHARS) in str(info.value)
    assert got == []
    # Stopped at the first read that took it past the limit (the head is 29 characters).
    assert stream.taken == MAX_EVENT_CHARS // 65536


async def test_events_before_an_endless_line_are_delivered_first() -> None:
    stream = Endless("data: a\n\ndata: b\n\n: keep-alive without end ", "y" * 40)
    got: list[list[str]] = []
    with pytest.raises(SseLimitError):
        async for batch in aiter_sse_batches(stream.__aiter__(), max_chars=100):
            got.append(batch)
    assert got == [["a", "b"]]
    assert stream.taken == 2  # 25 + 40 + 40 characters pending


@pytest.mark.parametrize(
    "chunks",
    [
        ("data: " + "x" * 101 + "\n\n",),  # one complete line, in one read
        ("data: " + "x" * 60, "x" * 41 + "\n\n"),  # completed by a later read
        ("data: " + "x" * 60 + "\n" + "data: " + "x" * 40 + "\n\n",),  # 60 + 1 + 40 joined
        ("data: " + "x" * 60 + "\ndata: " + "x" * 40,),  # the unterminated final event
    ],
    ids=["line", "split-line", "multi-line-event", "final-event"],
)
async def test_lines_and_events_over_the_limit_are_refused(chunks: tuple[str, ...]) -> None:
    with pytest.raises(SseLimitError):
        await batches(*chunks, max_chars=100)


async def test_lines_and_events_at_the_limit_pass() -> None:
    line = "data: " + "x" * 94  # 100 characters
    assert await batches(line + "\n\n", max_chars=100) == [["x" * 94]]
    event = "data: " + "x" * 60 + "\ndata: " + "x" * 39 + "\n\n"  # joined: 60 + 1 + 39
    assert await batches(event, max_chars=100) == [["x" * 60 + "\n" + "x" * 39]]
    # The count starts again with each event.
    assert await batches(event, event, max_chars=100) == [[event[6:66] + "\n" + "x" * 39]] * 2


def _reference(chunks: list[str], max_chars: int) -> list[list[str]] | str:
    """The line-by-line reading the splitter's fast path must agree with (or its error)."""
    pending, data, size, out = "", [], 0, []
    try:
        for chunk in chunks:
            *lines, pending = (pending + chunk).split("\n")
            batch = []
            for raw in lines:
                line = raw.removesuffix("\r")
                if len(line) > max_chars:
                    raise SseLimitError(max_chars)
                if not line:
                    if data:
                        batch.append("\n".join(data))
                        data, size = [], 0
                elif line.startswith("data:"):
                    value = line[5:].removeprefix(" ")
                    size += len(value) + (1 if data else 0)
                    if size > max_chars:
                        raise SseLimitError(max_chars)
                    data.append(value)
            if batch:
                out.append(batch)
            if len(pending) > max_chars:
                raise SseLimitError(max_chars)
        tail = pending.removesuffix("\r")
        if tail.startswith("data:"):
            value = tail[5:].removeprefix(" ")
            size += len(value) + (1 if data else 0)
            if size > max_chars:
                raise SseLimitError(max_chars)
            data.append(value)
        if data:
            out.append(["\n".join(data)])
    except SseLimitError:
        return f"limit after {out!r}"
    return out


async def test_the_fast_path_reads_every_framing_as_line_by_line_reading_does() -> None:
    """Random streams of one-line events, multi-line events, comments, CRLF, blank runs and
    long lines, cut at random places: the splitter gives the same batches (or the same error
    after the same batches) as reading line by line."""
    import random

    pieces = ["data: {}\n\n", "data:x\n\n", "data: a\ndata: b\n\n", ": ka\n\n", "\n\n",
              "data: y\r\n\r\n", "event: e\ndata: z\n\n", "data: " + "w" * 40 + "\n\n",
              "id: 1\n", "data: [DONE]\n\n", "data: q\n"]  # fmt: skip
    rng = random.Random(20)
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 5))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        max_chars = rng.choice([30, 45, MAX_EVENT_CHARS])
        expected = _reference(chunks, max_chars)
        got: list[list[str]] = []
        try:
            got = await batches(*chunks, max_chars=max_chars)
        except SseLimitError:
            # Batches delivered before the error are the ones the reference delivered.
            partial: list[list[str]] = []
            with contextlib.suppress(SseLimitError):
                async for batch in aiter_sse_batches(feed(*chunks), max_chars):
                    partial.append(batch)
            assert expected == f"limit after {partial!r}", (chunks, max_chars)
            continue
        assert got == expected, (chunks, max_chars)
