"""What callers and backends may call things: ids, model names, and text bound for logs.

Request ids and backend ids end up in log lines, metric labels and HTTP bodies, so they are
restricted to a printable token alphabet: a newline in one would forge a log line. Model names
are free text (backends name models as they like) but bounded and free of control
characters. Any other text from callers or backends is passed through :func:`escape` before
it is logged.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_ID_CHARS",
    "MAX_MODELS_PER_BACKEND",
    "MAX_MODEL_CHARS",
    "MAX_NAME_CHARS",
    "TOKEN_ALPHABET",
    "check_model",
    "check_name",
    "check_request_id",
    "check_token",
    "escape",
]

#: Characters allowed in request ids and backend ids.
TOKEN_ALPHABET = "A-Z a-z 0-9 and - . _ ~ : / @ + ="
_TOKEN = re.compile(r"[A-Za-z0-9._~:/@+=-]+")
MAX_ID_CHARS = 128
MAX_MODEL_CHARS = 256
MAX_MODELS_PER_BACKEND = 64
#: Longest team name, wherever one is given (``[[teams]]``, a key's team in the file or the
#: store, a quota's or budget's team, a token's team claim), and longest user name of a token
#: or a quota (OpenID Connect bounds ``sub`` at 255 characters).
MAX_NAME_CHARS = 256
# C0 and C1 controls, DEL, and the Unicode line/paragraph separators some log viewers honour.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_token(value: str, what: str, max_chars: int = MAX_ID_CHARS) -> None:
    """Refuse ``value`` unless it is 1-``max_chars`` characters of :data:`TOKEN_ALPHABET`.

    Raises:
        ValueError: with a message naming ``what``.

    """
    if not value or len(value) > max_chars:
        raise ValueError(f"{what} must be 1-{max_chars} characters")
    if _TOKEN.fullmatch(value) is None:
        raise ValueError(f"{what} may contain only {TOKEN_ALPHABET}")


def check_name(value: object, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """Return ``value`` if it is a usable user or team name, else raise.

    Any text is a name (unicode, spaces, something shaped like a key): it is kept verbatim.
    Only emptiness, length and control characters (which would forge log lines) are refused.

    Raises:
        ValueError: with a message naming ``what``.

    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > max_chars:
        raise ValueError(f"{what} is longer than {max_chars} characters")
    if _UNSAFE.search(value):
        raise ValueError(f"{what} contains control characters")
    return value


def check_request_id(value: str) -> None:
    """Refuse a caller's request id unless it is a token (:func:`check_token`); both doors.

    The id reaches the backend (vLLM's ``request_id``), log lines and the ``x-request-id``
    header, where a newline, a quote or U+2028 would forge or break a line.

    Raises:
        ValueError: naming ``request_id``.

    """
    check_token(value, "request_id")


def check_model(name: str, what: str = "model name") -> None:
    """Refuse a model name that is empty, over 256 characters or holds control characters.

    Raises:
        ValueError: with a message naming ``what``.

    """
    if not name:
        raise ValueError(f"{what} is required")
    if len(name) > MAX_MODEL_CHARS:
        raise ValueError(f"{what} is longer than {MAX_MODEL_CHARS} characters")
    if _UNSAFE.search(name):
        raise ValueError(f"{what} contains control characters")


def escape(text: str, limit: int = 1000) -> str:
    """Return ``text`` safe for one log line: controls escaped, at most ``limit`` characters.

    Escaping (a newline becomes the two characters backslash and n) keeps what the caller sent
    readable while making it impossible to end the line or color the terminal.
    """
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
