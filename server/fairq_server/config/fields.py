"""The vocabulary every section's fields are declared in: TOML's types, strictly, and ``section``.

A field of the configuration is declared once, with everything about it::

    max_retries: Annotated[Int, doc("times a failed request is sent again", ge=0)] = 1

its type (``Int``: an integer, never a quoted number nor ``true``), its default, its bounds
(``ge``, ``gt``, ``le``) and its help (the text the generated reference shows,
``docs/configuration.md``). Sections are frozen standard dataclasses, so the code builds and
copies them as it always has (``dataclasses.replace``) at no validation cost;
:mod:`.loader` validates a file against them with pydantic, which reads the same annotations.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, TypeVar

from pydantic import ConfigDict, Field, Strict, with_config
from pydantic.fields import FieldInfo

__all__ = ["Bool", "Float", "Int", "Str", "bare", "doc", "field_info", "section"]

#: Exactly TOML's types: ``"12"`` is not an integer, ``true`` is not 1, ``1.5`` is not an
#: integer (an integer is a number, as in TOML's own arithmetic).
Str = Annotated[str, Strict()]
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]

T = TypeVar("T")

# Unknown keys are refused (a typo must not silently keep a default); NaN and infinity are
# never a setting (TOML can write them: ``nan``, ``inf``).
_SECTION = ConfigDict(extra="forbid", allow_inf_nan=False)


def section(cls: type[T]) -> type[T]:
    """Mark a configuration dataclass as a section: unknown keys refused, numbers finite."""
    return with_config(_SECTION)(cls)


def doc(
    text: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> Any:
    """Return a field's help and bounds, the metadata of its ``Annotated`` type.

    Args:
        text: what the setting does, in the operator's terms (one or a few sentences).
        ge: the value must be at least this.
        gt: the value must be above this.
        le: the value must be at most this.

    """
    return Field(description=text, ge=ge, gt=gt, le=le)


def field_info(hint: Any) -> FieldInfo | None:
    """Return the :func:`doc` of an ``Annotated`` field hint (None: it has none)."""
    if typing.get_origin(hint) is not typing.Annotated:
        return None
    infos = [m for m in hint.__metadata__ if isinstance(m, FieldInfo)]
    return infos[0] if infos else None


def bare(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and without ``| None`` (TOML has no null)."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return bare(args[0]) if len(args) == 1 else tp
    return tp
