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

__all__ = ["MAX_EVENT_CHARS", "SseLimitError", "SseSplitter", "aiter_sse_batches"]

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


class SseSplitter:
    r"""Splits received text into the ``data`` payloads of complete events, read by read.

    :meth:`feed` takes each piece of text as it arrives and returns the payloads of the events
    it completed; :meth:`end` returns the final event if the stream stopped without its blank
    line. A synchronous object, so a reading loop pays no generator per layer per read.

    The common framing (every event one ``data:`` line, ``\n\n`` after it, no pending lines
    from an earlier read) is split on ``\n\n`` at once; anything else goes line by line.
    Both give the same payloads and the same limits.
    """

    __slots__ = ("_data", "_max", "_overflow", "_pending", "_size")

    def __init__(self, max_chars: int = MAX_EVENT_CHARS) -> None:
        self._max = max_chars
        self._pending = ""
        self._data: list[str] = []
        self._size = 0  # length of "\n".join(self._data)
        self._overflow = False  # the unfinished line is too long: raised after the batch

    def check(self) -> None:
        """Raise if the unfinished line is already too long.

        :meth:`feed` returns the events a read completed before refusing the line after them;
        call this once they are handled (the next :meth:`feed` or :meth:`end` also raises).

        Raises:
            SseLimitError: the unfinished line is longer than the limit.

        """
        if self._overflow:
            raise SseLimitError(self._max)

    def feed(self, chunk: str) -> list[str]:
        """Return the payloads of the events ``chunk`` completed.

        Raises:
            SseLimitError: a line, or the joined data of one event, is longer than the limit.

        """
        self.check()
        text = self._pending + chunk if self._pending else chunk
        batch: list[str] = []
        if self._data or "\r" in text:
            self._lines(text, batch)
            return self._checked(batch)
        *blocks, rest = text.split("\n\n")
        limit = self._max
        for block in blocks:
            if "\n" not in block and block.startswith("data:"):
                if len(block) > limit:
                    raise SseLimitError(limit)
                batch.append(block[6:] if block.startswith("data: ") else block[5:])
            else:  # the block's lines, then the blank line that ended it
                self._lines(block + "\n\n", batch)
        if rest:
            self._lines(rest, batch)
        else:
            self._pending = ""
        return self._checked(batch)

    def _checked(self, batch: list[str]) -> list[str]:
        if not batch:
            self.check()
        return batch

    def _lines(self, text: str, batch: list[str]) -> None:
        *lines, self._pending = text.split("\n")
        limit = self._max
        for raw in lines:
            line = raw.removesuffix("\r")
            if len(line) > limit:
                raise SseLimitError(limit)
            if not line:
                if self._data:
                    batch.append("\n".join(self._data))
                    self._data, self._size = [], 0
            elif (value := _field_value(line)) is not None:
                self._size += len(value) + (1 if self._data else 0)
                if self._size > limit:
                    raise SseLimitError(limit)
                self._data.append(value)
        if len(self._pending) > limit:
            self._overflow = True

    def end(self) -> list[str]:
        """Return the final event if the stream stopped without the blank line after it.

        Raises:
            SseLimitError: its data is longer than the limit.

        """
        self.check()
        if (value := _field_value(self._pending.removesuffix("\r"))) is not None:
            self._size += len(value) + (1 if self._data else 0)
            if self._size > self._max:
                raise SseLimitError(self._max)
            self._data.append(value)
        self._pending = ""
        data, self._data, self._size = self._data, [], 0
        return ["\n".join(data)] if data else []


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
    splitter = SseSplitter(max_chars)
    async for chunk in chunks:
        if batch := splitter.feed(chunk):
            yield batch
            splitter.check()
    if tail := splitter.end():
        yield tail
