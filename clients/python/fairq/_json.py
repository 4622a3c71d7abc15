"""JSON objects to and from ``google.protobuf.Struct``, for the pass-through fields.

A ``Struct`` holds every number as a double. Going in, an integer a double
cannot hold exactly (beyond 2**53) is refused rather than rounded; coming out,
whole numbers become ``int`` again, as the server does for what it forwards,
so a tool call's ``index`` reads ``0``, not ``0.0``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from google.protobuf import struct_pb2

__all__ = ["JsonValue"]

JsonValue: TypeAlias = (
    "str | int | float | bool | Mapping[str, JsonValue] | Sequence[JsonValue] | None"
)
"""A JSON value: a ``str``, number, ``bool``, ``None``, or a mapping or sequence of them."""

_EXACT_INT = 2**53


def struct_from_json(obj: Mapping[str, JsonValue], name: str) -> struct_pb2.Struct:
    """Convert a JSON object into a ``Struct``.

    Args:
        obj: The object.
        name: How the caller names it, for error messages (e.g. ``"extra"``).

    Raises:
        TypeError: ``obj`` is not a mapping with string keys, or holds a value
            that is not JSON (named by its path, e.g. ``extra['tools'][0]``).
        ValueError: An integer beyond 2**53 in magnitude, or a float that is
            not finite.

    """
    if not isinstance(obj, Mapping):
        raise TypeError(f"{name} must be a mapping of str keys, not {type(obj).__name__}")
    struct = struct_pb2.Struct()
    _fill_struct(struct, obj, name)
    return struct


def json_from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """Convert a ``Struct`` into a plain ``dict``, whole numbers as ``int``."""
    return {key: _from_value(value) for key, value in struct.fields.items()}


def _fill_struct(struct: struct_pb2.Struct, obj: Mapping[Any, Any], path: str) -> None:
    for key, item in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"{path} has a key {key!r} that is not a str")
        _fill_value(struct.fields[key], item, f"{path}[{key!r}]")


def _fill_value(value: struct_pb2.Value, item: Any, path: str) -> None:
    # bool first: it is an int subclass.
    if item is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(item, bool):
        value.bool_value = item
    elif isinstance(item, int):
        if abs(item) > _EXACT_INT:
            raise ValueError(f"{path} = {item} is beyond 2**53, which a JSON double cannot hold")
        value.number_value = item
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise ValueError(f"{path} = {item} is not a finite number")
        value.number_value = item
    elif isinstance(item, str):
        value.string_value = item
    elif isinstance(item, Mapping):
        value.struct_value.SetInParent()
        _fill_struct(value.struct_value, item, path)
    elif isinstance(item, Sequence) and not isinstance(item, bytes | bytearray):
        value.list_value.SetInParent()
        for index, element in enumerate(item):
            _fill_value(value.list_value.values.add(), element, f"{path}[{index}]")
    else:
        raise TypeError(f"{path} is a {type(item).__name__}, which is not a JSON value")


def _from_value(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) <= _EXACT_INT else number
    if kind == "struct_value":
        return json_from_struct(value.struct_value)
    if kind == "list_value":
        return [_from_value(v) for v in value.list_value.values]
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None
