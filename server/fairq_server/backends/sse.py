r"""Server-sent events, read in batches.

Each network read can carry several events. Handing them to the caller together lets the
relay merge the text of a burst into one gRPC message: when fairq falls behind a fast backend
it sends fewer, larger chunks instead of falling further behind; when it keeps up, every
event still goes out on its own, so latency is unchanged.

Only what inference servers send is interpreted: ``data:`` fields (with or without the space
after the colon; several in one event are joined by newlines); ``:`` comments (TGI's
keep-alives) and other fields are skipped. Lines end with ``\n`` or ``\r\n`` (a lone ``\r``,
which no inference server sends, is not treated as a line end).

A line, or the data of one event, longer than :data:`MAX_EVENT_CHARS` raises
:class:`SseLimitError`: a backend sending an endless line must not grow fairq's memory without
bound. Real events are a few hundred characters (one token's JSON).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

__all__ = ["MAX_EVENT_CHARS", "SseLimitError", "aiter_sse_batches"]

MAX_EVENT_CHARS = 1024 * 1024
"""Longest line, and longest joined ``data`` of one event, in characters (1 MiB of ASCII)."""


class SseLimitError(ValueError):
    """A line or an event of the stream is longer than the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a server-sent event line or event exceeds {limit} characters")
        self.limit = limit


def _field_value(line: str) -> str | None:
    if not line.startswith("data:"):
        return None
    value = line[5:]
    return value[1:] if value.startswith(" ") else value


async def aiter_sse_batches(
    chunks: AsyncIterator[str], max_chars: int = MAX_EVENT_CHARS
) -> AsyncIterator[list[str]]:
    """Yield, per received text chunk, the ``data`` payloads of the events it completed.

    A final event without a terminating blank line is still delivered at end of stream.

    Raises:
        SseLimitError: a line, or the joined data of one event, is longer than ``max_chars``.
            An unfinished line is refused as soon as it is too long, so no more than about
            twice ``max_chars`` plus one chunk is ever held.

    """
    pending = ""
    data: list[str] = []
    size = 0  # length of "\n".join(data)
    async for chunk in chunks:
        *lines, pending = (pending + chunk).split("\n")
        batch: list[str] = []
        for raw in lines:
            line = raw.removesuffix("\r")
            if len(line) > max_chars:
                raise SseLimitError(max_chars)
            if not line:
                if data:
                    batch.append("\n".join(data))
                    data, size = [], 0
            elif (value := _field_value(line)) is not None:
                size += len(value) + (1 if data else 0)
                if size > max_chars:
                    raise SseLimitError(max_chars)
                data.append(value)
        if batch:
            yield batch
        if len(pending) > max_chars:
            raise SseLimitError(max_chars)
    if (value := _field_value(pending.removesuffix("\r"))) is not None:
        size += len(value) + (1 if data else 0)
        if size > max_chars:
            raise SseLimitError(max_chars)
        data.append(value)
    if data:
        yield ["\n".join(data)]
