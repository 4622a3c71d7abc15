"""Checking the parameters fairq passes through to a backend without interpreting them.

Both doors pass on what they do not interpret: gRPC callers in ``GenerateRequest.extra``, HTTP
callers as the other fields of their JSON body. fairq bounds them (size as compact JSON,
nesting depth) so a request cannot make fairq hold or re-serialise megabytes per call, and
refuses keys it sets itself, so a caller cannot choose its own backend priority or slip a
larger ``max_tokens`` past the limits, nor an engine's own name for the output bound
(:mod:`fairq_server.backends.output_bound`); ``n`` and ``best_of`` are bounded by
``limits.max_sequences``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from fairq_server.backends.output_bound import ENGINE_TOKEN_LIMITS, SEQUENCE_COUNTS
from fairq_server.config.schema import RequestBounds
from fairq_server.errors import InvalidRequestError

__all__ = ["check_extra", "json_depth", "output_bound", "string_chars"]


def output_bound(limits: RequestBounds, requested: int | None) -> int:
    """Return the output bound to send: ``requested``, or the default when the caller gave none.

    Sent always, so an engine's own default (vLLM's: the rest of the context) never applies.
    """
    if requested is not None:
        return requested
    return min(limits.default_max_tokens or limits.max_tokens, limits.max_tokens)


def json_depth(value: object) -> int:
    """Return the nesting depth of a JSON value (a scalar is 0, ``{}`` and ``[]`` are 1)."""
    depth = 0
    level: list[object] = [value]
    while True:
        children: list[object] = []
        for item in level:
            if isinstance(item, dict):
                children.extend(item.values())
            elif isinstance(item, list):
                children.extend(item)
            else:
                continue
            children.append(None)  # an empty container still counts as a level
        if not children:
            return depth
        depth += 1
        level = children


def string_chars(value: object, max_depth: int) -> int | None:
    """Return the characters of every string in a JSON value, keys included.

    Returns None if the value is nested deeper than ``max_depth`` (counted as
    :func:`json_depth` does); the walk stops there, so a deep value costs no more than a
    shallow one.
    """
    chars = depth = 0
    level: list[object] = [value]
    while level:
        children: list[object] = []
        containers = False
        for item in level:
            if isinstance(item, str):
                chars += len(item)
            elif isinstance(item, dict):
                containers = True
                chars += sum(len(k) for k in item)  # JSON keys are strings
                children.extend(item.values())
            elif isinstance(item, list):
                containers = True
                children.extend(item)
        if containers:
            depth += 1
            if depth > max_depth:
                return None
        level = children
    return chars


def _whole_numbers(value: Any) -> Any:
    """Turn floats without a fraction into ints (a Struct holds every number as a double)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def check_extra(
    extra: Mapping[str, Any],
    limits: RequestBounds,
    *,
    field: str,
    reserved: Iterable[str],
    from_struct: bool = True,
) -> dict[str, Any]:
    """Validate pass-through parameters and return them ready to merge into a JSON body.

    Args:
        extra: the parameters (a JSON object).
        limits: ``max_extra_bytes`` and ``max_extra_depth`` apply.
        field: how the caller names the parameters in error messages.
        reserved: keys that must not appear.
        from_struct: convert whole-number doubles to integers (``n: 2``, not ``2.0``).

    Raises:
        InvalidRequestError: a reserved key, too large, too deep, or a non-finite number.

    """
    clash = sorted(set(extra) & set(reserved))
    if clash:
        raise InvalidRequestError(
            f"{field} must not set {', '.join(clash)}: fairq sets "
            f"{'it' if len(clash) == 1 else 'them'} itself"
        )
    _check_engine_fields(extra, limits, field)
    depth = json_depth(dict(extra))
    if depth > limits.max_extra_depth:
        raise InvalidRequestError(
            f"{field} is nested {depth} levels deep; the limit is {limits.max_extra_depth}"
        )
    try:
        size = len(json.dumps(extra, separators=(",", ":"), allow_nan=False).encode())
    except ValueError:
        raise InvalidRequestError(f"{field} holds a number that is not finite") from None
    if size > limits.max_extra_bytes:
        raise InvalidRequestError(
            f"{field} is {size} bytes as JSON; the limit is {limits.max_extra_bytes}"
        )
    if from_struct:
        converted: dict[str, Any] = _whole_numbers(dict(extra))
        return converted
    return dict(extra)


def _check_engine_fields(extra: Mapping[str, Any], limits: RequestBounds, field: str) -> None:
    """Refuse an engine's own output bound, and more sequences than one slot may hold."""
    native = sorted(set(extra) & ENGINE_TOKEN_LIMITS)
    if native:
        raise InvalidRequestError(
            f"{field} must not set {', '.join(native)}: the output bound is max_tokens "
            f"(at most {limits.max_tokens})",
            param=native[0],
        )
    for key in SEQUENCE_COUNTS:
        value = extra.get(key)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # a Struct holds every number as a double
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(f"{key} must be a positive integer", param=key)
        if value > limits.max_sequences:
            raise InvalidRequestError(
                f"{key} is {value}; the limit is {limits.max_sequences} "
                "(limits.max_sequences: each sequence runs in the request's one backend slot)",
                param=key,
            )
