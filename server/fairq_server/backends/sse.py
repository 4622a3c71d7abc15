r"""Server-sent events, read in batches.

Each network read can carry several events. Handing them to the caller together lets the
relay merge the text of a burst into one gRPC message: when fairq falls behind a fast backend
it sends fewer, larger chunks instead of falling further behind; when it keeps up, every
event still goes out on its own, so latency is unchanged.

Only what inference servers send is interpreted: ``data:`` fields (with or without the space
after the colon; several in one event are joined by newlines); ``:`` comments (TGI's
keep-alives) and other fields are skipped. Lines end with ``\n`` or ``\r\n`` (a lone ``\r``,
which no inference server sends, is not treated as a line end).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

__all__ = ["aiter_sse_batches"]


def _field_value(line: str) -> str | None:
    if not line.startswith("data:"):
        return None
    value = line[5:]
    return value[1:] if value.startswith(" ") else value


async def aiter_sse_batches(chunks: AsyncIterator[str]) -> AsyncIterator[list[str]]:
    """Yield, per received text chunk, the ``data`` payloads of the events it completed.

    A final event without a terminating blank line is still delivered at end of stream.
    """
    pending = ""
    data: list[str] = []
    async for chunk in chunks:
        *lines, pending = (pending + chunk).split("\n")
        batch: list[str] = []
        for raw in lines:
            line = raw.removesuffix("\r")
            if not line:
                if data:
                    batch.append("\n".join(data))
                    data = []
            elif (value := _field_value(line)) is not None:
                data.append(value)
        if batch:
            yield batch
    if (value := _field_value(pending.removesuffix("\r"))) is not None:
        data.append(value)
    if data:
        yield ["\n".join(data)]
