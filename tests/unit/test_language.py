"""Which language a user's report is written in, and that its words and figures follow it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reports.content import language
from reports.content.render import missing_catalogs_warning, render
from reports.counters import FALLBACKS
from reports.look import ReportLook
from tests.unit.test_render_v2 import many_categories

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@pytest.mark.parametrize(
    ("requested", "locale", "catalog", "fell_back"),
    [
        pytest.param(None, "en_US", "en", False, id="none-is-the-default-without-falling-back"),
        pytest.param("  ", "en_US", "en", False, id="blank-is-none"),
        pytest.param("tr", "tr", "tr", False, id="turkish"),
        pytest.param("tr-TR", "tr_TR", "tr", False, id="a-region-keeps-its-numbers"),
        pytest.param("uz-Latn", "uz_Latn", "uz", False, id="uzbek-latin"),
        pytest.param("uz", "uz", "uz", False, id="uzbek-is-latin-by-default"),
        pytest.param("uz-Cyrl", "en_US", "en", True, id="uzbek-cyrillic-is-not-shipped"),
        # CLDR pairs no such region with the language: the language alone, not the default.
        pytest.param("tr-DE", "tr", "tr", False, id="turkish-in-germany"),
        pytest.param("de-US", "de", "de", False, id="german-in-the-us"),
        pytest.param("de-DE-u-co-phonebk", "de_DE", "de", False, id="an-extension-is-dropped"),
        # Babel reads it as Uzbek in Arabic script, which no catalog writes.
        pytest.param("uz-AF", "en_US", "en", True, id="uzbek-in-afghanistan-is-arabic-script"),
        pytest.param("de_AT", "de_AT", "de", False, id="underscore-too"),
        pytest.param("en-GB", "en_GB", "en", False, id="english-of-another-region"),
        pytest.param("fr", "en_US", "en", True, id="not-shipped"),
        pytest.param("xx-Unknown", "en_US", "en", True, id="unknown"),
        pytest.param("<script>", "en_US", "en", True, id="not-a-locale"),
    ],
)
def test_a_users_locale_picks_a_shipped_catalog_or_falls_back_to_the_default(
    requested: str | None, locale: str, catalog: str, fell_back: bool
) -> None:
    assert language.resolve(requested, "en_US") == (language.Language(locale, catalog), fell_back)


def test_the_default_is_written_in_its_own_words_when_they_ship_and_in_english_otherwise() -> None:
    assert language.resolve("xx", "de_DE") == (language.Language("de_DE", "de"), True)
    assert language.resolve(None, "fr_FR") == (language.Language("fr_FR", "en"), False)


@pytest.mark.parametrize("requested", ["C", "C.UTF-8", "POSIX", "und"])
def test_the_operating_systems_locale_names_are_no_ones_language(requested: str) -> None:
    # Babel reads each as English, in its POSIX variant with no grouping ("€ 1234.56").
    assert language.resolve(requested, "de_DE") == (language.Language("de_DE", "de"), True)


def test_english_in_its_posix_variant_is_read_as_english_with_its_grouping() -> None:
    assert language.resolve("en-US-POSIX", "de_DE") == (language.Language("en_US", "en"), False)


def test_a_fallback_is_counted_once_per_report_and_drained_by_the_metrics() -> None:
    FALLBACKS.drain()
    language.for_user("xx", "en_US")
    language.for_user("tr", "en_US")
    language.for_user(None, "en_US")
    language.for_user("fr", "en_US")
    assert FALLBACKS.drain() == {"locale": 2}
    assert FALLBACKS.drain() == {}


@pytest.mark.parametrize(
    ("locale", "words"),
    [
        ("tr", ["Merhaba Ada,", "Toplam harcama   $", "Kategoriye göre", "%", "Abonelikten çık: https://"]),
        ("uz-Latn", ["Hurmatli Ada,", "Jami sarflangan", "Toifalar boʻyicha", "Obunani bekor qilish: https://"]),
        ("de", ["Hallo Ada,", "Ausgaben gesamt", "Nach Kategorie", "Abbestellen: https://"]),
    ],
)
def test_every_part_is_worded_in_the_users_language(locale: str, words: list[str]) -> None:
    rendered = render(
        TEMPLATES, "v2", name="Ada", summary=many_categories(9), locale=locale, unsubscribe_url="https://x.test/u/t/"
    )
    for word in words:
        assert word in rendered.text, word
    english = ("Hello", "Total spent", "By category", "Unsubscribe", "other categories", "Share of spending")
    for part in (rendered.subject, rendered.text, rendered.html):
        assert not [word for word in english if word in part], locale


def test_turkish_numbers_and_months_are_written_the_turkish_way() -> None:
    rendered = render(TEMPLATES, "v2", name="Ada", summary=many_categories(9), locale="tr")
    assert rendered.subject == "Ekim 2026 raporunuz: $139,32 harcama"
    assert "Eylül 2026 dönemine göre $860,68 (%86,1) azaldı" in rendered.text


def test_the_html_part_says_its_language() -> None:
    for locale, tag in (("uz-Latn", "uz-Latn"), ("tr-TR", "tr"), ("xx", "en"), (None, "en")):
        html = render(TEMPLATES, "v2", name="Ada", summary=many_categories(3), locale=locale).html
        assert f'<html lang="{tag}">' in html, locale


def test_report_locale_words_the_reports_of_users_with_no_locale() -> None:
    rendered = render(
        TEMPLATES, "v2", name=None, summary=many_categories(3), look=ReportLook(locale="de_DE", currency="EUR")
    )
    assert rendered.text.splitlines()[2] == "Hallo,"
    assert "Ihr Bericht für Oktober 2026" in rendered.subject


@pytest.fixture
def new_version(tmp_path: Path) -> Path:
    """A templates folder with the shipped v1 and v2, and a v3 of v2's templates with only the
    German catalog: Turkish and Uzbek are missing."""
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES / "v1", templates / "v1")
    shutil.copytree(TEMPLATES / "v2", templates / "v2")
    shutil.copytree(TEMPLATES / "v2", templates / "v3", ignore=shutil.ignore_patterns("locale"))
    shutil.copytree(TEMPLATES / "v2" / "locale" / "de", templates / "v3" / "locale" / "de")
    return templates


def test_a_language_the_version_has_no_catalog_for_is_worded_in_english_with_its_numbers_and_counted(
    new_version: Path,
) -> None:
    FALLBACKS.drain()
    rendered = render(new_version, "v3", name="Ada", summary=many_categories(9), locale="tr")
    assert rendered.subject == "Your Ekim 2026 report: $139,32 spent"
    assert "Hello Ada," in rendered.text and "Eylül 2026" in rendered.text
    assert '<html lang="en">' in rendered.html
    assert FALLBACKS.drain() == {"catalog": 1}
    # The catalogs it has are used, the previous version keeps its own, and neither is counted.
    assert "Hallo Ada," in render(new_version, "v3", name="Ada", summary=many_categories(9), locale="de").text
    assert "Merhaba Ada," in render(new_version, "v2", name="Ada", summary=many_categories(9), locale="tr").text
    assert FALLBACKS.drain() == {}
    # REPORT_LOCALE's words too, for users with no locale of their own.
    look = ReportLook(locale="tr_TR", currency="USD")
    assert "Hello there," in render(new_version, "v3", name=None, summary=many_categories(3), look=look).text
    assert FALLBACKS.drain() == {"catalog": 1}


def test_a_process_is_told_at_start_which_languages_the_version_has_no_catalog_for(new_version: Path) -> None:
    warning = missing_catalogs_warning(new_version, "v3")
    assert warning is not None and warning.startswith("Template version 'v3' has no compiled catalog for tr, uz ")
    assert str(new_version / "v3" / "locale") in warning and "scripts/catalogs" in warning
    # The shipped v2 lacks none, and v1 is English only.
    assert missing_catalogs_warning(TEMPLATES, "v2") is None
    assert missing_catalogs_warning(new_version, "v2") is None
    assert missing_catalogs_warning(new_version, "v1") is None
