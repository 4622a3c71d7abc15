"""The console's markup: Jinja2 templates (``templates/``), autoescaped, loaded once at start.

Every page and fragment the console serves is rendered here from a template; no HTML is
written in Python. The environment escapes every value a template writes (``{{ ... }}``):

* autoescaping is on, and the environment's ``finalize`` writes each value as
  :func:`~fairq_server.console.text.esc` does (``html.escape`` with quotes, each invisible or
  direction-changing character named ``⟦U+202E⟧``), so a name cannot be markup nor pass for
  another name. The result is :class:`~markupsafe.Markup`, which autoescaping leaves as it is;
* a value that is already markup (a fragment rendered by another template, a macro's output)
  is written as it is: the only way HTML enters a page is through a template;
* ``|exact`` escapes without naming controls: the hidden inputs that post a stored name back
  as it is (a name holding a control character must still match).

Templates are written one element per line, indented; the loader joins the lines (a line
break and the next line's indentation are dropped) when it reads a template, so the pages
carry no whitespace between tags, as the f-strings they replace wrote them, and a space that
matters is written inside a line. The environment is built at import, every template is
compiled by :func:`load` when the console is built, and ``auto_reload`` is off: a render
never looks at the files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape

import jinja2
from markupsafe import Markup

from fairq_server.console.text import esc, plain

__all__ = ["ENV", "load", "render"]

# A line break and the indentation after it: dropped when a template is read.
_LINE_BREAK = re.compile(r"\n[ \t]*")


class _JoinedLines(jinja2.PackageLoader):
    """The package's ``templates/`` folder, each template's lines joined as it is read."""

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool] | None]:
        source, filename, uptodate = super().get_source(environment, template)
        return _LINE_BREAK.sub("", source), filename, uptodate


def _markup(text: str) -> Markup:
    """Return escaped ``text`` as markup, made at C speed (``Markup()`` itself is Python)."""
    return str.__new__(Markup, text)


def _finalize(value: object) -> Markup:
    """Write a template's value: markup as it is, anything else escaped by :func:`esc`.

    It runs once per value a page writes (tens of thousands for a large queue), so the
    common cases are short: a plain name or figure is used as it is.
    """
    if isinstance(value, Markup):
        return value
    if type(value) is str:
        return _markup(value if plain(value) else esc(value))
    if type(value) in (int, float):
        return _markup(str(value))  # digits (a subclass could write anything: escaped below)
    return _markup(esc(value))


def _exact(value: object) -> Markup:
    """Escape ``value`` without naming its controls (a stored name posted back as it is)."""
    return Markup(escape(str(value), quote=True))  # escaped on this line


ENV = jinja2.Environment(
    loader=_JoinedLines("fairq_server.console", "templates"),
    autoescape=True,
    auto_reload=False,
    cache_size=-1,  # every template stays compiled (there are a few dozen at most)
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the render, not shows blank
    finalize=_finalize,
)
ENV.filters["exact"] = _exact


def load() -> int:
    """Compile every template now (a broken one fails the start); return how many there are."""
    names = ENV.list_templates(extensions=["html", "svg"])
    for name in names:
        ENV.get_template(name)
    return len(names)


def render(name: str, /, **context: object) -> Markup:
    """Return template ``name`` rendered with ``context``, as markup to embed or serve."""
    return Markup(ENV.get_template(name).render(context))  # an autoescaped template
