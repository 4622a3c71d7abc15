"""Filling the clients' dataclasses from proto messages, field by field of the same name.

The dataclasses mirror the messages (same field names), so the conversion is
written once here rather than as one ``name=message.name`` line per field in
every converter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.message import Message

__all__: list[str] = []

_T = TypeVar("_T")


def from_message(cls: type[_T], message: Message, **given: Any) -> _T:
    """Build ``cls`` from the fields of ``message`` with the same names.

    Args:
        cls: A dataclass.
        message: The proto message it mirrors.
        **given: Values of the fields that need converting (nested messages,
            repeated fields, enums); they take precedence.

    """
    names = (f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    copied = {name: getattr(message, name) for name in names if name not in given}
    return cls(**copied, **given)
