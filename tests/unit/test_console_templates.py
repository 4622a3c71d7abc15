"""The console's templates: all compiled at start, every value escaped, markup only from them."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from markupsafe import Markup

from fairq_server.console import templating
from fairq_server.console.render import message_page, page

TEMPLATES = Path(templating.__file__).parent / "templates"


def test_every_template_compiles_once_and_the_environment_never_reloads() -> None:
    assert templating.load() == len(list(TEMPLATES.glob("*.html")))
    assert templating.ENV.autoescape is True and templating.ENV.auto_reload is False
    first = templating.ENV.get_template("page.html")
    assert templating.ENV.get_template("page.html") is first  # compiled once, kept


def test_values_are_escaped_and_controls_named_in_text_and_attributes() -> None:
    html = page("queues", 'admin\u202egnp."<script>', "t'&", Markup("<p>live</p>"))
    assert "admin⟦U+202E⟧gnp.&quot;&lt;script&gt;" in html and "\u202e" not in html
    assert 'value="t&#x27;&amp;"' in html  # the CSRF token, an attribute
    assert '<div id="live" aria-live="off"><p>live</p></div>' in html  # markup kept as is
    # A fragment given as plain text is text, never markup.
    assert "&lt;b&gt;" in page("queues", "a", "t", "<b>")  # type: ignore[arg-type]


def test_lines_are_joined_and_no_inline_script_or_style_appears() -> None:
    html = message_page("Refused", "x")
    assert "\n" not in html and "  " not in html
    assert html.startswith('<!doctype html><html lang="en"><head><meta charset="utf-8">')
    for source in TEMPLATES.glob("*.html"):  # the CSP allows the console's own files only
        text = source.read_text()
        assert "<style" not in text and " style=" not in text, source.name
        assert "<script>" not in text and " on" + "click=" not in text, source.name


def test_exact_keeps_a_posted_back_name_as_stored_and_a_misspelt_name_fails() -> None:
    assert templating.ENV.from_string("{{ v | exact }}").render(v="a\u202e<") == "a\u202e&lt;"
    with pytest.raises(jinja2.UndefinedError):
        templating.render("message.html", title="only a title")
