"""Text as the console shows it: escaped for HTML, with invisible controls made visible.

Names (users, teams, key ids, models, backends' errors) come from callers, keys and the
store. Escaping keeps them from being markup; it does not keep them from being misleading:
a bidirectional override (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) between ``admin`` and
``gnp.`` makes the name read ``admin.png``, and a zero-width character makes two names that
differ look alike. So every such character is written as a visible mark naming it
(``⟦U+202E⟧``), in the page and in attributes alike; forms post names back as they are, and
the CSV downloads keep them as stored (they are data).
"""

from __future__ import annotations

import re
from html import escape

__all__ = ["esc", "plain", "visible"]

# Bidirectional formatting (embeddings, overrides, isolates, marks), zero-width characters,
# the other C0/C1 controls but tab and newline, and the line/paragraph separators.
_CONTROLS = (
    "\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u2069\ufeff"
)
_INVISIBLE = re.compile(f"[{_CONTROLS}]")


def _mark(match: re.Match[str]) -> str:
    return f"⟦U+{ord(match.group()):04X}⟧"


def visible(value: object) -> str:
    """Return ``str(value)`` with each invisible or direction-changing character named."""
    return _INVISIBLE.sub(_mark, str(value))


def esc(value: object) -> str:
    """Return ``value`` as HTML text or attribute value: escaped, controls made visible."""
    return escape(visible(value), quote=True)


def plain(text: str) -> bool:
    """Whether ``esc(text)`` is ``text`` itself (nothing to escape or name: most names).

    Printable ASCII without the five characters HTML escapes; anything else (a name in
    another script, a tab) is left to :func:`esc`, which gives it back unchanged if it is.
    """
    return (
        text.isascii()
        and text.isprintable()
        and "&" not in text
        and "<" not in text
        and ">" not in text
        and '"' not in text
        and "'" not in text
    )
