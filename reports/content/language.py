"""The language a user's report is written in: theirs when it ships, ``REPORT_LOCALE``'s otherwise.

A user's locale (BCP 47, ``tr`` or ``uz-Latn``) picks both the words, from the template version's
gettext catalog, and the numbers, money and month names, from Babel's CLDR data.
"""

from __future__ import annotations

import gettext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from babel import Locale
from babel.support import Translations

from reports.counters import FALLBACKS
from reports.look import locale_candidates, parse_locale

#: The language the templates are written in: it needs no catalog.
SOURCE = "en"
#: The catalogs each template version ships besides the source. Uzbek is written in Latin script.
CATALOGS = ("de", "tr", "uz")
#: The scripts a shipped language is written in, where it has several.
_SCRIPTS = {"uz": ("Latn",)}
#: Every template version's catalogs sit in ``<version>/locale/<catalog>/LC_MESSAGES/report.mo``.
DOMAIN = "report"


@dataclass(frozen=True)
class Language:
    #: Babel's name of the locale whose numbers and months the report uses: ``tr``, ``de_AT``.
    locale: str
    #: The catalog its words come from: :data:`SOURCE` or one of :data:`CATALOGS`.
    catalog: str

    @property
    def tag(self) -> str:
        """The BCP 47 tag of the words, for the HTML part's ``lang``: ``uz-Latn``."""
        return "uz-Latn" if self.catalog == "uz" else self.catalog


def catalog_of(locale: Locale) -> str | None:
    """The shipped catalog that writes ``locale``'s language, or ``None``."""
    if locale.language == SOURCE:
        return SOURCE
    if locale.language not in CATALOGS:
        return None
    scripts = _SCRIPTS.get(locale.language)
    if scripts is not None and locale.script is not None and locale.script not in scripts:
        return None
    return locale.language


@lru_cache(maxsize=1024)
def resolve(requested: str | None, default: str) -> tuple[Language, bool]:
    """The language for a user whose locale is ``requested``, and whether it fell back to ``default``.

    ``default`` is ``REPORT_LOCALE`` (checked at start-up); a user with no locale takes it without
    falling back. A locale Babel does not know, or one no catalog writes, falls back.
    """
    if requested is None or not requested.strip():
        return default_language(default), False
    # The most specific locale Babel knows: a region CLDR has not paired with the language (tr-DE)
    # comes down to the language, but a script no catalog writes (uz-Cyrl) is not read as another.
    parsed = next(locale_candidates(requested), None)
    catalog = None if parsed is None else catalog_of(parsed)
    if parsed is None or catalog is None:
        return default_language(default), True
    return Language(locale=str(parsed), catalog=catalog), False


def for_user(locale: str | None, default: str) -> Language:
    """The language of a user whose stored locale is ``locale``; a fallback is counted."""
    language, fell_back = resolve(locale, default)
    if fell_back:
        FALLBACKS.add("locale")
    return language


def from_accept_language(header: str | None, default: str) -> Language:
    """The shipped language a browser's ``Accept-Language`` prefers most, else ``default``'s.

    Tags are tried by their ``q`` weight, highest first (ties in the header's order); ``q=0`` means
    not wanted. A header that cannot be read is no preference.
    """
    weighted: list[tuple[float, int, str]] = []
    for position, part in enumerate((header or "")[:1024].split(",")):
        tag, _, parameters = part.strip().partition(";")
        weight = 1.0
        name, _, value = parameters.strip().partition("=")
        if name.strip() == "q":
            try:
                weight = float(value)
            except ValueError:
                continue
        if tag and tag != "*" and weight > 0:
            weighted.append((-weight, position, tag))
    for _, _, tag in sorted(weighted):
        chosen, fell_back = resolve(tag, default)
        if not fell_back:
            return chosen
    return default_language(default)


@lru_cache(maxsize=32)
def default_language(default: str) -> Language:
    """``REPORT_LOCALE`` as a language: its own words when they ship, the source's otherwise."""
    parsed = parse_locale(default)
    return Language(locale=str(parsed), catalog=catalog_of(parsed) or SOURCE)


def missing_catalogs(locale_dir: Path, domain: str = DOMAIN) -> tuple[str, ...]:
    """The shipped languages (:data:`CATALOGS`) with no compiled catalog in ``locale_dir``."""
    return tuple(c for c in CATALOGS if not (locale_dir / c / "LC_MESSAGES" / f"{domain}.mo").is_file())


def in_words_of(language: Language, missing: tuple[str, ...]) -> Language:
    """``language``, or the source's words with its numbers when its catalog is ``missing``; that
    fallback is counted (``catalog``)."""
    if language.catalog not in missing:
        return language
    FALLBACKS.add("catalog")
    return Language(locale=language.locale, catalog=SOURCE)


@lru_cache(maxsize=64)
def translations(locale_dir: Path, catalog: str, domain: str = DOMAIN) -> gettext.NullTranslations:
    """The words of ``catalog`` from ``locale_dir/<catalog>/LC_MESSAGES/<domain>.mo``; the source's
    words are the texts' own."""
    if catalog == SOURCE:
        return gettext.NullTranslations()
    return Translations.load(str(locale_dir), [catalog], domain=domain)
