"""How a report looks and reads: the brand, the locale and the currency, built once from Settings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from babel import Locale, UnknownLocaleError
from babel.numbers import list_currencies

from reports.errors import ConfigurationError
from reports.sender import parse_sender

#: A colour the templates accept: ``#rgb`` or ``#rrggbb``. Nothing else can reach the CSS.
_COLOUR = re.compile(r"#(?:[0-9a-fA-F]{3}){1,2}")
#: A logo URL: https, and nothing that could leave the ``src`` attribute or the CSS.
_LOGO_URL = re.compile(r"https://[^\s\"'<>\\()]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: Longest product name and postal address, in characters: both sit on one line of the header or footer.
MAX_PRODUCT_NAME_CHARS = 60
MAX_POSTAL_ADDRESS_CHARS = 200


class LookSettings(Protocol):
    """What :meth:`ReportLook.from_settings` reads (:class:`reports.settings.Settings` has it)."""

    @property
    def mail_from(self) -> str: ...
    @property
    def report_product_name(self) -> str: ...
    @property
    def report_brand_color(self) -> str: ...
    @property
    def report_accent_color(self) -> str: ...
    @property
    def report_logo_url(self) -> str | None: ...
    @property
    def report_postal_address(self) -> str: ...
    @property
    def report_locale(self) -> str: ...
    @property
    def report_currency(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class ReportLook:
    """Branding and locale of the reports; hashable, so a template version is built once per look.

    The defaults are the settings' defaults: a report rendered without a look reads as
    ``REPORT_*`` unset would make it read.
    """

    product_name: str = "Monthly Reports"
    #: Header band, headings and links.
    brand_colour: str = "#1d4ed8"
    #: The chart's bars.
    accent_colour: str = "#0ea5e9"
    #: Shown in the header instead of the product name when set (the name stays its ``alt`` text).
    logo_url: str | None = None
    #: The sender as the footer names it: ``MAIL_FROM``'s address.
    sender_email: str = "reports@localhost"
    #: The sender's postal address for the footer (anti-spam laws ask for one); empty shows none.
    postal_address: str = ""
    locale: str = "en_US"
    currency: str = "USD"

    def __post_init__(self) -> None:
        for variable, colour in (
            ("REPORT_BRAND_COLOR", self.brand_colour),
            ("REPORT_ACCENT_COLOR", self.accent_colour),
        ):
            if not _COLOUR.fullmatch(colour):
                raise ConfigurationError(f"{variable} must be a hex colour such as #1d4ed8, got {colour!r}.")
        if self.logo_url is not None and not _LOGO_URL.fullmatch(self.logo_url):
            raise ConfigurationError(
                f"REPORT_LOGO_URL must be an https:// URL without spaces, quotes or parentheses, got {self.logo_url!r}."
            )
        _check_line("REPORT_PRODUCT_NAME", self.product_name, MAX_PRODUCT_NAME_CHARS, required=True)
        _check_line("REPORT_POSTAL_ADDRESS", self.postal_address, MAX_POSTAL_ADDRESS_CHARS, required=False)

    @classmethod
    def from_settings(cls, settings: LookSettings) -> ReportLook:
        return cls(
            product_name=settings.report_product_name,
            brand_colour=settings.report_brand_color,
            accent_colour=settings.report_accent_color,
            logo_url=settings.report_logo_url,
            sender_email=parse_sender(settings.mail_from).shown_address,
            postal_address=settings.report_postal_address,
            locale=settings.report_locale,
            currency=settings.report_currency,
        )

    def palette(self) -> dict[str, str]:
        """The colours the stylesheet's ``var(--name)`` stand for (email clients know no variables)."""
        return {
            "brand": self.brand_colour,
            "on-brand": on_colour(self.brand_colour),
            "accent": self.accent_colour,
        }


def on_colour(background: str) -> str:
    """White or near-black, whichever reads better on ``background`` (WCAG contrast ratio)."""
    light, dark = "#ffffff", "#111827"
    luminance = relative_luminance(background)
    on_light = (relative_luminance(light) + 0.05) / (luminance + 0.05)
    on_dark = (luminance + 0.05) / (relative_luminance(dark) + 0.05)
    return light if on_light >= on_dark else dark


def relative_luminance(colour: str) -> float:
    """WCAG 2 relative luminance of ``#rgb`` or ``#rrggbb``: 0 for black, 1 for white."""
    digits = colour.lstrip("#")
    if len(digits) == 3:
        digits = "".join(d * 2 for d in digits)
    channels = [int(digits[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _check_line(variable: str, value: str, limit: int, *, required: bool) -> None:
    if (required and not value.strip()) or len(value) > limit or _CONTROL.search(value):
        need = "a non-empty" if required else "a"
        raise ConfigurationError(
            f"{variable} must be {need} single line of at most {limit} characters, got {value[: limit + 20]!r}."
        )


#: A language subtag: two or three letters (BCP 47), such as ``tr`` or ``fil``.
_LANGUAGE = re.compile("[A-Za-z]{2,3}")


def locale_candidates(tag: str) -> Iterator[Locale]:
    """The locales Babel knows that a BCP 47 tag names (``tr-DE``, ``uz_Latn``,
    ``de-DE-u-co-phonebk``), most specific first: the tag, then the tag with its last part dropped,
    down to its language alone. CLDR has no ``tr_DE``; a Turkish speaker in Germany reads Turkish."""
    parts = [part for part in re.split("[-_]", tag.strip()) if part]
    # Babel reads the operating system's names (C, C.UTF-8, POSIX) and "und" as English: they
    # name no one's language, and fall back like any other unknown one.
    if not parts or not _LANGUAGE.fullmatch(parts[0]) or parts[0].lower() == "und":
        return
    for end in range(len(parts), 0, -1):
        try:
            locale = Locale.parse("_".join(parts[:end]))
        except (UnknownLocaleError, ValueError, TypeError):
            continue
        if locale.variant != "POSIX":
            yield locale


def parse_locale(tag: str) -> Locale:
    """The most specific locale Babel knows that ``tag`` names; :class:`ConfigurationError` if none."""
    found = next(locale_candidates(tag), None)
    if found is None:
        raise ConfigurationError(f"REPORT_LOCALE must be a locale such as en, en-US or uz-Latn, got {tag!r}.")
    return found


def check_locale(locale: str, currency: str) -> None:
    """Raise :class:`ConfigurationError` unless Babel knows ``locale`` and ``currency``."""
    parse_locale(locale)
    if currency not in list_currencies():
        raise ConfigurationError(
            f"REPORT_CURRENCY must be an ISO 4217 currency code such as USD or EUR, got {currency!r}."
        )
