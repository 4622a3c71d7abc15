"""Parsing a large JSON request body in slices, giving the event loop back between them.

``json.loads`` of an 8 MB body holds the event loop for 150-400 ms (building the objects is
most of it), and every other request waits. A thread does not help: the C decoder never
releases the GIL, so the loop stood still as long (measured: 0.48 s of loop lag for a 7.2 MB
body parsed in ``asyncio.to_thread`` against 0.41 s inline). So a body above
:data:`SLICE_CHARS` is parsed value by value: the top-level object's values, and the items
of the lists and objects inside it (an OpenAI body's bulk is its ``messages`` or ``prompt``
list), each by the C decoder (``JSONDecoder.raw_decode``), with a turn of the loop after
every :data:`SLICE_CHARS` characters. Anything deeper is one value for the C decoder. The
result and the errors are ``json.loads``'s (a ``ValueError`` naming the position).
"""

from __future__ import annotations

import asyncio
import json
import re

__all__ = ["SLICE_CHARS", "loads"]

#: Bodies up to this size are parsed at once; larger ones yield to the loop this often.
SLICE_CHARS = 256 * 1024

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_BLANK = frozenset(" \t\n\r")
_SLICED_LEVELS = 2  # the top-level object, and the containers directly inside it


class _Slicer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.since_turn = 0

    def space(self, i: int) -> int:
        return _SPACE.match(self.text, i).end()  # type: ignore[union-attr]  # always matches

    def expect(self, i: int, char: str) -> int:
        if self.text[i : i + 1] != char:
            raise json.JSONDecodeError(f"Expecting '{char}' delimiter", self.text, i)
        return self.space(i + 1)

    async def value(self, i: int, level: int) -> tuple[object, int]:
        opener = self.text[i : i + 1]
        if level >= _SLICED_LEVELS or opener not in ("{", "["):
            obj, end = _DECODER.raw_decode(self.text, i)
            self.since_turn += end - i
            if self.since_turn >= SLICE_CHARS:
                self.since_turn = 0
                await asyncio.sleep(0)  # a turn of the loop for other requests
            return obj, end
        if opener == "[":
            return await self._list(i, level)
        return await self._object(i, level)

    async def _list(self, i: int, level: int) -> tuple[object, int]:
        # The hot loop of a big body (one pass per message): locals, and the leaf decode
        # inlined rather than a coroutine per item.
        text, decode, space = self.text, _DECODER.raw_decode, _SPACE.match
        sliced = level + 1 < _SLICED_LEVELS
        items: list[object] = []
        i = space(text, i + 1).end()  # type: ignore[union-attr]  # always matches
        if text[i : i + 1] == "]":
            return items, i + 1
        while True:
            if sliced and text[i : i + 1] in ("{", "["):
                item, i = await self.value(i, level + 1)
            else:
                start = i
                item, i = decode(text, i)
                self.since_turn += i - start
                if self.since_turn >= SLICE_CHARS:
                    self.since_turn = 0
                    await asyncio.sleep(0)  # a turn of the loop for other requests
            items.append(item)
            char = text[i : i + 1]
            if char in _BLANK:
                i = space(text, i).end()  # type: ignore[union-attr]
                char = text[i : i + 1]
            if char == "]":
                return items, i + 1
            if char != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
            i += 1
            if text[i : i + 1] in _BLANK:
                i = space(text, i).end()  # type: ignore[union-attr]

    async def _object(self, i: int, level: int) -> tuple[object, int]:
        obj: dict[str, object] = {}
        i = self.space(i + 1)
        if self.text[i : i + 1] == "}":
            return obj, i + 1
        while True:
            if self.text[i : i + 1] != '"':
                raise json.JSONDecodeError(
                    "Expecting property name enclosed in double quotes", self.text, i
                )
            key, i = _DECODER.raw_decode(self.text, i)
            i = self.expect(self.space(i), ":")
            obj[key], i = await self.value(i, level + 1)
            i = self.space(i)
            if self.text[i : i + 1] == "}":
                return obj, i + 1
            i = self.expect(i, ",")


async def loads(raw: bytes) -> object:
    """Parse ``raw`` as ``json.loads`` would, in slices if it is large.

    Raises:
        ValueError: not valid JSON (``json.JSONDecodeError``) or not decodable text.
        RecursionError: nested too deeply for the decoder.

    """
    if len(raw) <= SLICE_CHARS:
        return json.loads(raw)
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    slicer = _Slicer(text)
    obj, end = await slicer.value(slicer.space(0), 0)
    end = slicer.space(end)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return obj
