"""What a report says, worked out before any template runs: pure functions of a summary and a look.

Templates only lay out what is here, so every figure, sentence and width is tested directly
(``tests/unit/test_report_view.py``), and the HTML and text parts cannot tell different stories.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from gettext import NullTranslations
from typing import Literal

from reports.content.activity import CategoryTotal, Summary
from reports.content.formats import Formats

#: Bars in the chart: the largest categories, then one bar for all the others.
CHART_BARS = 6
#: Rows in the category table; the rest are summed into one row, so that the HTML part stays far
#: under Gmail's 102 KB clipping limit whatever the number of categories.
TABLE_ROWS = 40
#: Longest name or category shown, in characters; longer ones end with an ellipsis.
MAX_LABEL_CHARS = 60
#: Width of the text part's bars, in characters, for a category with all of the month's spending.
TEXT_BAR_CHARS = 20

Direction = Literal["up", "down", "same", "new"]
EmptyMonth = Literal["send", "skip"]


@dataclass(frozen=True)
class Bar:
    """One bar of the chart: its label, amount and share, and its width in percent of the chart."""

    label: str
    amount: str
    share: str
    width: int


@dataclass(frozen=True)
class Row:
    label: str
    count: str
    amount: str


@dataclass(frozen=True)
class Change:
    direction: Direction
    #: The sentence both parts show, such as ``Up $234.56 (23.5%) on September 2026``.
    text: str


@dataclass(frozen=True)
class ReportView:
    #: The BCP 47 tag of the language the report is written in, for the HTML part's ``lang``.
    lang: str
    #: ``None`` when the user has no name: the greeting then has none.
    name: str | None
    #: The HTML part's title (a title holds text only, so it is worded here rather than in the template).
    title: str
    month: str
    previous_month: str
    total: str
    count: str
    previous_total: str
    #: False when the previous month recorded nothing (no percentage can be given).
    had_previous: bool
    change: Change
    bars: tuple[Bar, ...]
    rows: tuple[Row, ...]
    #: True when the month had no activity: the short, friendly variant.
    empty: bool
    preheader: str
    #: The text part's total, count and change, one line each, the figures aligned.
    figures_table: tuple[str, ...]
    #: The category table and chart of the text part, one line each, aligned for a monospace font.
    text_table: tuple[str, ...]
    unsubscribe_url: str | None


def is_empty(summary: Summary) -> bool:
    return summary.count == 0 and not summary.by_category


def build(
    summary: Summary,
    *,
    name: str | None,
    formats: Formats,
    words: NullTranslations | None = None,
    lang: str = "en",
    unsubscribe_url: str | None = None,
) -> ReportView:
    """Everything a v2 report shows, in ``words``' language and ``formats``' numbers and months."""
    words = NullTranslations() if words is None else words
    month, previous = formats.month(summary.period), formats.month(summary.period.previous())
    categories = sorted(summary.by_category, key=lambda c: (-c.total_cents, c.category))
    bars = chart(categories, formats, words)
    rows = table(categories, formats, words)
    total, change = formats.money(summary.total_cents), describe_change(summary, formats, previous, words)
    count = formats.count(summary.count)
    if is_empty(summary):
        preheader = words.gettext("No activity was recorded in %(month)s.") % {"month": month}
    else:
        spent = words.ngettext(
            "%(total)s across %(count)s activity in %(month)s.",
            "%(total)s across %(count)s activities in %(month)s.",
            summary.count,
        ) % {"total": total, "count": count, "month": month}
        preheader = f"{spent} {change.text}."
    return ReportView(
        lang=lang,
        name=shorten(name) if name else None,
        title=words.gettext("Your %(month)s report") % {"month": month},
        month=month,
        previous_month=previous,
        total=total,
        count=count,
        previous_total=formats.money(summary.previous_total_cents),
        had_previous=summary.previous_total_cents != 0,
        change=change,
        bars=bars,
        rows=rows,
        empty=is_empty(summary),
        preheader=preheader,
        figures_table=figures_table((total, count, change.text), words),
        text_table=text_table(rows, bars, words),
        unsubscribe_url=_link(unsubscribe_url),
    )


def describe_change(
    summary: Summary, formats: Formats, previous_month: str, words: NullTranslations | None = None
) -> Change:
    """The change against the previous month in words, with its direction and percent."""
    words = NullTranslations() if words is None else words
    month = {"month": previous_month}
    if summary.previous_total_cents == 0:
        if summary.total_cents == 0:
            return Change("same", words.gettext("Nothing in %(month)s either") % month)
        return Change("new", words.gettext("New this month: nothing was recorded in %(month)s") % month)
    amount = formats.money(abs(summary.change_cents))
    # Rounded half away from zero in integers: float percentages print 0.05 steps inconsistently.
    tenths, rest = divmod(abs(summary.change_cents) * 1000, abs(summary.previous_total_cents))
    tenths += 2 * rest >= abs(summary.previous_total_cents)
    figures = {"amount": amount, "percent": formats.percent(tenths), **month}
    if summary.change_cents > 0:
        return Change("up", words.gettext("Up %(amount)s (%(percent)s) on %(month)s") % figures)
    if summary.change_cents < 0:
        return Change("down", words.gettext("Down %(amount)s (%(percent)s) on %(month)s") % figures)
    return Change("same", words.gettext("The same as %(month)s") % month)


def others_label(count: int, formats: Formats, words: NullTranslations) -> str:
    """The label of the row or bar that sums the ``count`` smallest categories."""
    return words.ngettext("%(count)s other category", "%(count)s other categories", count) % {
        "count": formats.count(count)
    }


def chart(categories: Sequence[CategoryTotal], formats: Formats, words: NullTranslations) -> tuple[Bar, ...]:
    """The largest categories as bars, the others as one; widths in percent of the month's spending.

    Only spending is drawn: a category whose total is zero or negative (refunds) gets no bar. The
    widths are whole percents that sum to exactly 100 (largest remainder), so the bars laid end to
    end fill the chart.
    """
    spent = [c for c in categories if c.total_cents > 0]
    if not spent:
        return ()
    shown = spent[:CHART_BARS] if len(spent) <= CHART_BARS else spent[: CHART_BARS - 1]
    rest = spent[len(shown) :]
    items = [(shorten(c.category), c.total_cents) for c in shown]
    if rest:
        items.append((others_label(len(rest), formats, words), sum(c.total_cents for c in rest)))
    widths = shares([cents for _, cents in items])
    return tuple(
        Bar(label=label, amount=formats.money(cents), share=_share(width, cents, formats), width=width)
        for (label, cents), width in zip(items, widths, strict=True)
    )


def shares(amounts: Sequence[int]) -> list[int]:
    """Whole percents of ``amounts``' sum that add up to exactly 100 (largest remainder method).

    Ties in the remainder go to the earlier amount, so equal amounts in order get equal or
    decreasing shares. All zeros give all zeros.
    """
    total = sum(amounts)
    if total <= 0:
        return [0] * len(amounts)
    floors = [a * 100 // total for a in amounts]
    order = sorted(range(len(amounts)), key=lambda i: (-(amounts[i] * 100 % total), i))
    for i in order[: 100 - sum(floors)]:
        floors[i] += 1
    return floors


def table(categories: Sequence[CategoryTotal], formats: Formats, words: NullTranslations) -> tuple[Row, ...]:
    """The category table's rows, largest first; past :data:`TABLE_ROWS`, the rest as one row."""
    shown = categories if len(categories) <= TABLE_ROWS else categories[: TABLE_ROWS - 1]
    rows = [Row(shorten(c.category), formats.count(c.count), formats.money(c.total_cents)) for c in shown]
    rest = categories[len(shown) :]
    if rest:
        rows.append(
            Row(
                others_label(len(rest), formats, words),
                formats.count(sum(c.count for c in rest)),
                formats.money(sum(c.total_cents for c in rest)),
            )
        )
    return tuple(rows)


def figures_table(figures: tuple[str, str, str], words: NullTranslations) -> tuple[str, ...]:
    """The text part's total, count and change under labels padded to one width, as a monospace font shows them."""
    labels = (words.gettext("Total spent"), words.gettext("Activities"), words.gettext("Change"))
    width = max(display_width(label) for label in labels) + 3
    return tuple(f"{pad(label, width)}{figure}" for label, figure in zip(labels, figures, strict=True))


def text_table(rows: Sequence[Row], bars: Sequence[Bar], words: NullTranslations) -> tuple[str, ...]:
    """The text part's category table, then its chart: columns padded by display width, so that
    wide characters (CJK) and combining marks keep the columns straight in a monospace font."""
    if not rows:
        return ()
    headings = Row(words.gettext("Category"), words.gettext("Activities"), words.gettext("Amount"))
    label_width = max(display_width(r.label) for r in (headings, *rows))
    count_width = max(display_width(r.count) for r in (headings, *rows))
    amount_width = max(display_width(r.amount) for r in (headings, *rows))
    lines = [
        f"{pad(r.label, label_width)}  {pad(r.count, count_width, right=True)}  {pad(r.amount, amount_width, right=True)}"
        for r in (headings, *rows)
    ]
    lines.insert(1, f"{'-' * label_width}  {'-' * count_width}  {'-' * amount_width}")
    if bars:
        bar_label = max(display_width(b.label) for b in bars)
        share_width = max(display_width(b.share) for b in bars)
        lines += ["", words.gettext("Share of spending"), ""]
        lines += [
            f"{pad(b.label, bar_label)}  {pad(b.share, share_width, right=True)}  "
            f"{'#' * max(1 if b.width else 0, round(b.width * TEXT_BAR_CHARS / 100))}".rstrip()
            for b in bars
        ]
    return tuple(lines)


#: Unicode categories that take no column: marks drawn on the character before them (Thai's
#: vowel and tone marks too, which ``unicodedata.combining`` says are not combining), enclosing
#: marks, and format characters (the zero-width joiner of an emoji sequence).
_ZERO_WIDTH = frozenset(("Mn", "Me", "Cf"))


def display_width(text: str) -> int:
    """Columns ``text`` takes in a monospace font: wide and full-width characters take two,
    marks and format characters none."""
    if text.isascii():
        return len(text)
    width = 0
    for char in text:
        if unicodedata.category(char) in _ZERO_WIDTH:
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def pad(text: str, width: int, *, right: bool = False) -> str:
    fill = " " * max(0, width - display_width(text))
    return fill + text if right else text + fill


def shorten(text: str) -> str:
    """``text`` on one line, cut to :data:`MAX_LABEL_CHARS` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_LABEL_CHARS else line[: MAX_LABEL_CHARS - 1].rstrip() + "…"


def _share(width: int, cents: int, formats: Formats) -> str:
    return formats.whole_percent(width) if width or not cents else "<" + formats.whole_percent(1)


def _link(url: str | None) -> str | None:
    # Only a web link is linked: anything else (javascript:, a typo) would be worse than no link.
    return url if url is not None and url.startswith(("https://", "http://")) else None
