"""Render a report from the versioned Jinja2 templates: pure, no I/O beyond reading templates."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from reports.content import formats, inline_css, language, view
from reports.content.activity import Summary
from reports.errors import UnknownTemplateVersion
from reports.look import ReportLook

_PARTS = ("subject.txt.j2", "report.txt.j2", "report.html.j2")


@dataclass(frozen=True)
class RenderedReport:
    subject: str
    text: str
    html: str


def money(cents: int) -> str:
    """``123456`` → ``1,234.56``; negative amounts keep their sign."""
    sign = "-" if cents < 0 else ""
    whole, rest = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{rest:02d}"


def signed_money(cents: int) -> str:
    return ("+" if cents > 0 else "") + money(cents)


#: A version folder with this stylesheet is a styled version (v2 on): the stylesheet is inlined into
#: its HTML part when it is built, and its templates read a :class:`~reports.content.view.ReportView`.
STYLESHEET = "report.css"

#: The look of reports rendered without one: every ``REPORT_*`` setting at its default.
DEFAULT_LOOK = ReportLook()


@lru_cache(maxsize=64)
def missing_catalogs(templates_dir: Path, version: str) -> tuple[str, ...]:
    """The shipped languages a styled version has no compiled catalog for: their users' reports are
    worded in English. An unstyled version (v1) is English only, and lacks none."""
    folder = templates_dir / version
    if not (folder / STYLESHEET).is_file():
        return ()
    return language.missing_catalogs(folder / "locale")


def missing_catalogs_warning(templates_dir: Path, version: str) -> str | None:
    """The one line a process says at start when ``version`` lacks a shipped language's catalog."""
    missing = missing_catalogs(templates_dir, version)
    if not missing:
        return None
    return (
        f"Template version {version!r} has no compiled catalog for {', '.join(missing)} "
        f"(in {templates_dir / version / 'locale'}): those users' reports are worded in English, "
        'counted in reports_user_fallbacks_total{fact="catalog"}; run scripts/catalogs.'
    )


@dataclass(frozen=True)
class _Templates:
    subject: jinja2.Template
    text: jinja2.Template
    html: jinja2.Template
    styled: bool


@lru_cache(maxsize=64)
def _templates(templates_dir: Path, version: str, look: ReportLook, catalog: str) -> _Templates:
    """The version's three parts in one language, compiled once per look; a styled version's HTML
    with its CSS inlined.

    Kept as compiled templates so that a render does no file system check (Jinja's loader looks
    at the file's mtime on every ``get_template``).
    """
    folder = templates_dir / version
    if not all((folder / part).is_file() for part in _PARTS):
        raise UnknownTemplateVersion(f"Template version {version!r} does not exist.")
    stylesheet = folder / STYLESHEET
    styled = stylesheet.is_file()
    built: dict[str, str] = {}
    if styled:
        built["report.html.j2"] = inline_css.inline(
            (folder / "report.html.j2").read_text(encoding="utf-8"),
            stylesheet.read_text(encoding="utf-8"),
            variables=look.palette(),
        )
    environment = jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.DictLoader(built), jinja2.FileSystemLoader(folder)]),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        extensions=["jinja2.ext.i18n"],
    )
    # The words come from the version's own catalogs, so a version pins its wording as it pins its layout.
    environment.install_gettext_translations(language.translations(folder / "locale", catalog), newstyle=True)  # type: ignore[attr-defined]
    environment.filters["money"] = money
    environment.filters["signed_money"] = signed_money
    if styled:
        environment.globals["look"] = look
    subject, text, html = (environment.get_template(part) for part in _PARTS)
    return _Templates(subject=subject, text=text, html=html, styled=styled)


def render(
    templates_dir: Path,
    version: str,
    *,
    name: str | None,
    summary: Summary,
    look: ReportLook | None = None,
    locale: str | None = None,
    unsubscribe_url: str | None = None,
) -> RenderedReport:
    """Render one report.

    :param look: branding, locale and currency (:meth:`ReportLook.from_settings`, built once per
        process); ``None`` is :data:`DEFAULT_LOOK`. Version ``v1`` ignores it.
    :param locale: the user's own locale as stored (BCP 47); ``None``, or one no catalog writes, is
        the look's (a fallback is counted). A language whose catalog the version lacks is worded in
        English with its own numbers (a fallback is counted too). Version ``v1`` is English only.
    :param unsubscribe_url: the user's one-click unsubscribe link for the footer; ``None`` makes the
        footer say how to stop the reports without a link. Version ``v1`` shows no footer.
    """
    look = DEFAULT_LOOK if look is None else look
    lang = language.in_words_of(language.for_user(locale, look.locale), missing_catalogs(templates_dir, version))
    templates = _templates(templates_dir, version, look, lang.catalog)
    context: dict[str, object] = {"name": name or "there", "period": summary.period, "summary": summary}
    if templates.styled:
        context["view"] = view.build(
            summary,
            name=name,
            formats=formats.for_locale(lang.locale, look.currency),
            words=language.translations(templates_dir / version / "locale", lang.catalog),
            lang=lang.tag,
            unsubscribe_url=unsubscribe_url,
        )
    subject = templates.subject.render(context)
    return RenderedReport(
        # A subject is one line whatever the template or the data do.
        subject=" ".join(subject.split()),
        text=templates.text.render(context),
        html=templates.html.render(context),
    )
