"""Inline a stylesheet into a Jinja2 HTML template's source, once, when the template is built.

Email clients drop ``<style>`` (Gmail keeps only some of it, Outlook.com rewrites it), so every
base style must sit in a ``style`` attribute; doing that per report would be slow, so it
is done to the template's source instead. css-inline parses HTML, not Jinja: before it runs, each
statement (``{% … %}``) becomes an HTML comment, which the HTML parser keeps in place even between
table rows, and each expression (``{{ … }}``) a token of private-use characters, which it keeps in
text and attribute values alike. They are put back afterwards, and the result is refused unless
every tag came back exactly once, in order.

Media queries (the phone layout, dark mode) cannot be inlined: css-inline keeps them in a
``<style>`` in the head, for the clients that read it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import css_inline

from reports.errors import ReportsError


class TemplateBuildError(ReportsError):
    """A template could not be built with its stylesheet inlined."""


_TAG = re.compile(r"\{%.*?%\}|\{\{.*?\}\}|\{#.*?#\}", re.DOTALL)
_COMMENT = "<!--jinja:{}-->"
_TOKEN = "\ue000{}\ue001"
_RESTORE = re.compile(r"<!--jinja:([0-9]+)-->|\ue000([0-9]+)\ue001")
_VARIABLE = re.compile(r"var\(--([a-z0-9-]+)\)")
_CSS_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)


def resolve_variables(text: str, values: Mapping[str, str]) -> str:
    """Replace each ``var(--name)`` in ``text`` (a stylesheet or a template) with its value: email
    clients know no CSS variables."""

    def value(match: re.Match[str]) -> str:
        try:
            return values[match[1]]
        except KeyError:
            raise TemplateBuildError(f"The stylesheet uses var(--{match[1]}), which no setting defines.") from None

    return _VARIABLE.sub(value, text)


def inline(source: str, css: str, *, variables: Mapping[str, str]) -> str:
    """``source`` (a Jinja2 HTML template) with ``css`` inlined into its elements' ``style``, and
    ``var(--name)`` in either replaced by ``variables[name]``."""
    tags: list[str] = []

    def protect(match: re.Match[str]) -> str:
        tag = match[0]
        if tag.startswith("{#"):
            return ""
        tags.append(tag)
        return (_TOKEN if tag.startswith("{{") else _COMMENT).format(len(tags) - 1)

    protected = _TAG.sub(protect, resolve_variables(source, variables))
    # Comments would be sent in every email (css-inline keeps them in the at-rules it keeps).
    css = resolve_variables(_CSS_COMMENT.sub("", css), variables)
    if not css.isascii():
        # The HTML part may travel with its other characters as character references, which
        # the <style> that keeps the media queries would not decode (CSS has its own: \2014).
        raise TemplateBuildError("The stylesheet must be ASCII: write other characters as CSS escapes, such as \\2014.")
    # No remote stylesheets: building a template must not fetch anything.
    inliner = css_inline.CSSInliner(extra_css=css, keep_at_rules=True, minify_css=True, load_remote_stylesheets=False)
    try:
        inlined = inliner.inline(protected)
    except ValueError as error:
        raise TemplateBuildError(f"The stylesheet could not be inlined: {error}") from None
    found = [int(m[1] or m[2]) for m in _RESTORE.finditer(inlined)]
    if found != list(range(len(tags))):
        raise TemplateBuildError(
            "Inlining the stylesheet moved or dropped a Jinja tag: keep statements between elements"
            " (not inside a tag) and rows inside an explicit <tbody>."
        )
    return _RESTORE.sub(lambda m: tags[int(m[1] or m[2])], inlined)
