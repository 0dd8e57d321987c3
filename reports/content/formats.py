"""Money, percentages and month names written the way a locale writes them, from Babel's CLDR data.

Babel's ``format_currency`` parses the locale, the pattern and a ``Decimal`` on every call, too slow
for a report with many categories (docs/benchmarks.md, "Rendering"). So :func:`for_locale` asks
Babel once per locale and currency for the parts of the format and writes each amount from its
integer minor units; ``tests/unit/test_formats.py`` checks the result against ``format_currency``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache

from babel import Locale
from babel.dates import format_date, format_skeleton
from babel.numbers import (
    format_currency,
    format_percent,
    get_currency_precision,
    get_decimal_symbol,
    get_group_symbol,
)

from reports.errors import ConfigurationError
from reports.look import check_locale, parse_locale
from reports.periods import Period

#: The digit Babel is asked to format to find the text around a number: one digit, no grouping.
_PROBE = 7


@dataclass(frozen=True)
class _Affixes:
    """The text before and after a number, for a positive and for a negative value."""

    positive: tuple[str, str]
    negative: tuple[str, str]


@dataclass(frozen=True)
class Formats:
    """How one locale writes one currency's amounts, percentages and months."""

    locale: str
    currency: str
    #: Digits after the decimal symbol: 2 for USD and EUR, 0 for JPY, 3 for BHD.
    digits: int
    decimal: str
    group: str
    #: CLDR grouping sizes: (3, 3) for 1,234,567; (3, 2) for India's 12,34,567.
    grouping: tuple[int, int]
    _money: _Affixes
    _percent: _Affixes

    def money(self, minor_units: int) -> str:
        """``123456`` (cents) → ``$1,234.56`` in en_US with USD, ``1.234,56 €`` in de_DE with EUR."""
        before, after = self._money.negative if minor_units < 0 else self._money.positive
        whole, fraction = divmod(abs(minor_units), 10**self.digits)
        number = self._grouped(whole)
        if self.digits:
            number = f"{number}{self.decimal}{fraction:0{self.digits}d}"
        return f"{before}{number}{after}"

    def percent(self, tenths: int) -> str:
        """A percentage given in tenths of a percent, with one decimal: ``235`` → ``23.5%`` (``23,5 %``)."""
        before, after = self._percent.negative if tenths < 0 else self._percent.positive
        whole, tenth = divmod(abs(tenths), 10)
        return f"{before}{self._grouped(whole)}{self.decimal}{tenth}{after}"

    def whole_percent(self, percent: int) -> str:
        """A whole percentage: ``81`` → ``81%`` (``81 %`` in de_DE)."""
        before, after = self._percent.negative if percent < 0 else self._percent.positive
        return f"{before}{self._grouped(abs(percent))}{after}"

    def count(self, number: int) -> str:
        """A count with the locale's grouping: ``12345`` → ``12,345`` (``12.345``)."""
        return ("-" if number < 0 else "") + self._grouped(abs(number))

    def month(self, period: Period) -> str:
        """The month and year as the locale names them: ``October 2026``, ``Oktober 2026``."""
        return _month(period, self.locale)

    def _grouped(self, whole: int) -> str:
        digits = str(whole)
        primary, secondary = self.grouping
        if len(digits) <= primary:
            return digits
        head, groups = digits[:-primary], [digits[-primary:]]
        while len(head) > secondary:
            groups.append(head[-secondary:])
            head = head[:-secondary]
        groups.append(head)
        return self.group.join(reversed(groups))


@lru_cache(maxsize=32)
def for_locale(locale: str, currency: str) -> Formats:
    """The formats of ``locale`` and ``currency``, asked of Babel once and kept."""
    check_locale(locale, currency)
    parsed = parse_locale(locale)
    digits = get_currency_precision(currency)
    decimal = get_decimal_symbol(parsed)
    probe = f"{_PROBE}{decimal}{'0' * digits}" if digits else str(_PROBE)
    money = _Affixes(
        positive=_around(format_currency(Decimal(_PROBE), currency, locale=parsed), probe),
        negative=_around(format_currency(Decimal(-_PROBE), currency, locale=parsed), probe),
    )
    # One decimal, as "23.5%": the locale's own pattern with its integer part given a fraction.
    pattern = parsed.percent_formats[None].pattern.split(";")[0].replace("0", "0.0", 1)
    percent_probe = f"{_PROBE}{decimal}0"
    percent = _Affixes(
        positive=_around(format_percent(Decimal(_PROBE) / 100, pattern, locale=parsed), percent_probe),
        negative=_around(format_percent(Decimal(-_PROBE) / 100, pattern, locale=parsed), percent_probe),
    )
    grouping = parsed.currency_formats["standard"].grouping
    return Formats(
        locale=str(parsed),
        currency=currency,
        digits=digits,
        decimal=decimal,
        group=get_group_symbol(parsed),
        grouping=(int(grouping[0]), int(grouping[1])),
        _money=money,
        _percent=percent,
    )


def _around(formatted: str, number: str) -> tuple[str, str]:
    before, found, after = formatted.partition(number)
    if not found:
        raise ConfigurationError(f"Babel wrote {formatted!r}, which does not contain {number!r}.")
    return before, after


@lru_cache(maxsize=256)
def _month(period: Period, locale: str) -> str:
    if _year_first(locale):
        # Their own order and words: "2026年10月", "2026. október", not "10月 2026".
        return format_skeleton("yMMMM", period.start.date(), locale=locale)
    # "LLLL" is the stand-alone month name: "Oktober 2026", not the genitive some languages use in dates.
    return format_date(period.start.date(), "LLLL y", locale=locale)


def _year_first(locale: str) -> bool:
    """Whether the locale writes a month's year before its name (CLDR's ``yMMMM`` pattern)."""
    pattern = Locale.parse(locale).datetime_skeletons.get("yMMMM")
    return pattern is not None and pattern.pattern.startswith("y")
