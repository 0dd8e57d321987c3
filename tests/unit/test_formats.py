"""Money, percentages and months by locale: the fast formats write what Babel itself writes."""

from __future__ import annotations

from decimal import Decimal

import pytest
from babel.numbers import format_currency

from reports.content.formats import for_locale
from reports.errors import ConfigurationError
from reports.periods import Period

LOCALES = [
    ("en_US", "USD"),
    ("de_DE", "EUR"),
    ("fr_FR", "EUR"),
    ("nl_NL", "EUR"),
    ("en_GB", "GBP"),
    ("ja_JP", "JPY"),
    ("hi_IN", "INR"),
    ("sv_SE", "SEK"),
    ("pt_BR", "BRL"),
    ("ar_BH", "BHD"),
]
AMOUNTS = [0, 5, 99, 100, 123_456, 100_000_000, -5, -123_456, 1_234_567_891, 999_999_999_999]


@pytest.mark.parametrize(("locale", "currency"), LOCALES)
def test_money_is_written_exactly_as_babel_writes_it(locale: str, currency: str) -> None:
    formats = for_locale(locale, currency)
    for cents in AMOUNTS:
        expected = format_currency(Decimal(cents).scaleb(-formats.digits), currency, locale=locale)
        assert formats.money(cents) == expected, cents


@pytest.mark.parametrize(
    ("locale", "currency", "cents", "text"),
    [
        ("en_US", "USD", 123_456, "$1,234.56"),
        ("en_US", "USD", -5, "-$0.05"),
        ("de_DE", "EUR", 123_456, "1.234,56\xa0€"),
        ("de_DE", "EUR", -123_456, "-1.234,56\xa0€"),
        ("ja_JP", "JPY", 123_456, "￥123,456"),
        ("hi_IN", "INR", 123_456_789, "₹12,34,567.89"),
    ],
)
def test_money_reads_as_the_locale_writes_it(locale: str, currency: str, cents: int, text: str) -> None:
    assert for_locale(locale, currency).money(cents) == text


@pytest.mark.parametrize(
    ("locale", "tenths", "text"),
    [("en_US", 235, "23.5%"), ("en_US", 12_345, "1,234.5%"), ("de_DE", 235, "23,5\xa0%"), ("fr_FR", 5, "0,5\xa0%")],
)
def test_a_percentage_has_one_decimal_in_the_locales_form(locale: str, tenths: int, text: str) -> None:
    assert for_locale(locale, "EUR").percent(tenths) == text


@pytest.mark.parametrize(
    ("locale", "text"),
    [
        ("en_US", "October 2026"),
        ("de_DE", "Oktober 2026"),
        ("fr_FR", "octobre 2026"),
        ("uz_UZ", "Oktabr 2026"),
        ("ja_JP", "2026年10月"),
        ("zh_CN", "2026年10月"),
        ("ko_KR", "2026년 10월"),
        ("hu_HU", "2026. október"),
    ],
)
def test_the_month_is_named_in_the_locale(locale: str, text: str) -> None:
    assert for_locale(locale, "EUR").month(Period(2026, 10)) == text


@pytest.mark.parametrize(("locale", "currency"), [("xx_YY", "USD"), ("en_US", "usd"), ("en_US", "XYZ")])
def test_an_unknown_locale_or_currency_is_a_configuration_error(locale: str, currency: str) -> None:
    with pytest.raises(ConfigurationError):
        for_locale(locale, currency)
