"""SSE framing: events split across reads, batching per read, quirks of real servers."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fairq_server.backends.sse import aiter_sse_batches


async def feed(*chunks: str) -> AsyncIterator[str]:
    for chunk in chunks:
        yield chunk


async def batches(*chunks: str) -> list[list[str]]:
    return [b async for b in aiter_sse_batches(feed(*chunks))]


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
