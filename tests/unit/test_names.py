"""Ids, model names and log escaping (fairq_server.names, fairq_server.logs)."""

from __future__ import annotations

import logging

import pytest

from fairq_server.backends.http_reading import token_count
from fairq_server.logs import OneLineFormatter
from fairq_server.names import check_model, check_token, escape


@pytest.mark.parametrize("value", ["a", "req-1", "A.b_c~d:e/f@g+h=i", "x" * 128])
def test_tokens_in_the_alphabet_pass(value: str) -> None:
    check_token(value, "id")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("", "1-128"),
        ("x" * 129, "1-128"),
        ("a b", "may contain only"),
        ("a\nb", "may contain only"),
        ("é", "may contain only"),
        ("a;b", "may contain only"),
    ],
)
def test_tokens_outside_the_alphabet_are_refused(value: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        check_token(value, "id")


@pytest.mark.parametrize("name", ["", "m" * 257, "a\nb", "a\x1b[31m", "a\u2028b"])
def test_bad_model_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_model(name)


def test_model_names_may_be_any_printable_text() -> None:
    check_model("meta-llama/Llama-3.1 8B Instruct (q4) — ünïcode")


def test_escape_keeps_text_on_one_line_and_bounded() -> None:
    assert escape("a\r\nb\x1b[31mc\u2028") == "a\\r\\nb\\x1b[31mc\\u2028"
    assert escape("plain") == "plain"
    assert escape("x" * 50, limit=10) == "x" * 10 + "... (40 more characters)"


def test_the_formatter_escapes_the_message_but_not_the_traceback() -> None:
    formatter = OneLineFormatter("%(levelname)s %(message)s")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, "f", 1, "got %s", ("a\nFORGED",), None)
        record.exc_info = sys.exc_info()
    text = formatter.format(record)
    first, *rest = text.splitlines()
    assert first == "ERROR got a\\nFORGED"
    assert rest[0].startswith("Traceback") and "RuntimeError: boom" in rest[-1]


@pytest.mark.parametrize("value", [None, 0, 7, 7.0, 2**31 - 1])
def test_token_counts_accept_whole_numbers(value: object) -> None:
    assert token_count(value) == int(value or 0)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "value", [-5, 2.5, float("inf"), float("nan"), 1e300, 2**31, "3", True, [1]]
)
def test_token_counts_refuse_anything_else(value: object) -> None:
    with pytest.raises(ValueError):
        token_count(value)
