"""The v2 report as a person receives it: the HTML parsed, the text part read as a monospace reader shows it."""

from __future__ import annotations

import email
import email.policy
import html
import re
from dataclasses import dataclass, field
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reports.content.activity import CategoryTotal, Summary
from reports.content.inline_css import TemplateBuildError, inline
from reports.content.render import render
from reports.content.view import display_width
from reports.delivery.mail.compose import compose, recipient
from reports.look import ReportLook
from reports.periods import Period
from tests.unit.test_render import summary_factory

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
HOSTILE = '<script>alert("x")</script> & \'quoted\' "name"'
#: Gmail clips an HTML part larger than this, in bytes.
GMAIL_CLIP_BYTES = 102 * 1024
UNSUBSCRIBE = "https://reports.example.com/unsubscribe/abc.def"


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    #: Text and child elements, in document order.
    parts: list[str | Element] = field(default_factory=list)

    @property
    def children(self) -> list[Element]:
        return [p for p in self.parts if isinstance(p, Element)]

    @property
    def text(self) -> list[str]:
        return [p for p in self.parts if isinstance(p, str)]

    def all(self, tag: str | None = None, cls: str | None = None) -> list[Element]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and (cls is None or cls in child.attrs.get("class", "").split()):
                found.append(child)
            found += child.all(tag, cls)
        return found

    def content(self) -> str:
        # Only ASCII white space collapses, as in a browser: a no-break space is part of an amount.
        words = " ".join(p if isinstance(p, str) else p.content() for p in self.parts)
        return re.sub(r"[ \t\r\n]+", " ", words).strip()


class _TreeBuilder(HTMLParser):
    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].parts.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].parts.append(data)


def parse(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    assert builder.stack == [builder.root], "an element was left open"
    return builder.root


def v2(summary: Summary | None = None, **kwargs: object) -> tuple[str, str, str]:
    kwargs.setdefault("name", "Ada")
    rendered = render(TEMPLATES, "v2", summary=summary or summary_factory(), **kwargs)  # type: ignore[arg-type]
    return rendered.subject, rendered.text, rendered.html


def many_categories(count: int, *, label: str = "category") -> Summary:
    categories = tuple(CategoryTotal(f"{label} {i:03d}", i % 7 + 1, 1_000 + i * 137) for i in range(count))
    return summary_factory(
        by_category=categories,
        count=sum(c.count for c in categories),
        total_cents=sum(c.total_cents for c in categories),
    )


def test_the_layout_is_tables_600_pixels_wide_with_lang_and_a_preheader() -> None:
    _, _, html = v2()
    document = parse(html)
    [page] = document.all("html")
    assert page.attrs["lang"] == "en"
    [container] = document.all("table", "container")
    assert container.attrs["width"] == "600" and "max-width:600px" in container.attrs["style"].replace(" ", "")
    [preheader] = document.all("div", "preheader")
    assert "display:none" in preheader.attrs["style"].replace(" ", "")
    assert preheader.content().startswith(
        "$1,234.56 across 3 activities in October 2026. Up $234.56 (23.5%) on September 2026."
    )
    assert any(m.attrs.get("name") == "viewport" for m in document.all("meta"))


def test_every_layout_table_is_presentation_and_the_category_table_has_column_headings() -> None:
    document = parse(v2()[2])
    data = [t for t in document.all("table") if any(c.tag == "thead" for c in t.children)]
    assert len(data) == 1 and "role" not in data[0].attrs
    assert all(t.attrs.get("role") == "presentation" for t in document.all("table") if t not in data)
    headings = [th.content() for th in data[0].all("thead")[0].all("th")]
    assert headings == ["Category", "Activities", "Amount"]
    assert all(th.attrs["scope"] == "col" for th in data[0].all("thead")[0].all("th"))


def test_the_css_is_inlined_and_only_media_queries_stay_in_the_head() -> None:
    document = parse(v2()[2])
    [style] = document.all("style")
    css = " ".join(style.text)
    assert "prefers-color-scheme: dark" in css and "max-width: 620px" in css.replace(":620px", ": 620px")
    assert re.sub(r"@media[^{]*\{(?:[^{}]*\{[^{}]*\})*[^{}]*\}", "", css).strip() == ""
    [card] = document.all("td", "card")
    assert "background-color:#ffffff" in card.attrs["style"].replace(" ", "")
    [header] = document.all("td", "header")
    assert "#1d4ed8" in header.attrs["style"], "the brand colour was not put in"
    assert "var(" not in document.all("html")[0].attrs.get("style", "") and "var(--" not in v2()[2]


def test_the_header_shows_the_month_and_the_name_and_the_summary_the_total_and_the_change() -> None:
    document = parse(v2()[2])
    assert document.all("td", "header-month")[0].content() == "October 2026"
    assert document.all("h1")[0].content() == "Hello Ada,"
    assert document.all("p", "kpi-total")[0].content() == "$1,234.56"
    assert document.all("p", "kpi-count")[0].content() == "3"
    assert document.all("td", "change-cell")[0].content() == "▲ Up $234.56 (23.5%) on September 2026"


@pytest.mark.parametrize(
    ("previous", "total", "change"),
    [
        (200_000, 123_456, "▼ Down $765.44 (38.3%) on September 2026"),
        (123_456, 123_456, "The same as September 2026"),
        (0, 123_456, "New this month: nothing was recorded in September 2026"),
    ],
)
def test_the_change_says_its_direction_and_percent_or_that_last_month_had_nothing(
    previous: int, total: int, change: str
) -> None:
    document = parse(v2(summary_factory(previous_total_cents=previous, total_cents=total))[2])
    assert document.all("td", "change-cell")[0].content() == change


def test_every_user_text_is_escaped_and_shown_as_written() -> None:
    summary = summary_factory(by_category=(CategoryTotal(HOSTILE, 1, 100_000), CategoryTotal("food", 2, 23_456)))
    _, text, html = v2(summary, name=HOSTILE)
    assert "<script" not in html and 'alert("x")</script>' not in html
    document = parse(html)
    assert not document.all("script")
    assert document.all("h1")[0].content() == f"Hello {HOSTILE},"
    assert document.all("td", "chart-label")[0].content() == HOSTILE
    assert document.all("table", "data")[0].all("tbody")[0].all("td")[0].content() == HOSTILE
    assert f"Hello {HOSTILE}," in text and HOSTILE in text


def test_the_chart_draws_each_category_as_its_share_of_the_month_largest_first() -> None:
    categories = (
        CategoryTotal("food", 4, 25_000),
        CategoryTotal("travel", 1, 50_000),
        CategoryTotal("books", 2, 25_000),
    )
    document = parse(v2(summary_factory(by_category=categories, total_cents=100_000))[2])
    labels = [td.content() for td in document.all("td", "chart-label")]
    assert labels == ["travel", "books", "food"]
    widths = [int(td.attrs["width"].rstrip("%")) for td in document.all("td", "bar")]
    assert widths == [50, 25, 25]
    tracks = [int(td.attrs["width"].rstrip("%")) for td in document.all("td", "track")]
    assert [w + t for w, t in zip(widths, tracks, strict=True)] == [100, 100, 100]
    figures = [td.content() for td in document.all("td", "chart-figure")]
    assert figures == ["$500.00 · 50%", "$250.00 · 25%", "$250.00 · 25%"]


def test_the_chart_widths_sum_to_100_and_follow_the_amounts_for_many_categories() -> None:
    summary = many_categories(23)
    document = parse(v2(summary)[2])
    widths = [int(td.attrs["width"].rstrip("%")) for td in document.all("td", "bar")]
    assert sum(widths) == 100
    assert widths[:-1] == sorted(widths[:-1], reverse=True), "the largest categories come first"
    labels = [td.content() for td in document.all("td", "chart-label")]
    assert labels[0] == "category 022" and labels[-1] == "18 other categories"
    amounts = sorted((c.total_cents for c in summary.by_category), reverse=True)
    for width, cents in zip(widths[:-1], amounts, strict=False):
        assert abs(width - 100 * cents / summary.total_cents) < 1


def test_two_hundred_long_non_ascii_categories_stay_far_under_gmails_clipping_limit() -> None:
    summary = many_categories(200, label="Lebensmittel und Getränke für die ganze Familie ünd Fröhlichkeit ✓ " * 3)
    _, text, html = v2(summary, name="Zoë Ñúñez-Þórðardóttir " * 10)
    assert len(html.encode("utf-8")) < GMAIL_CLIP_BYTES * 0.6
    rows = parse(html).all("table", "data")[0].all("tbody")[0].all("tr")
    assert len(rows) == 40 and rows[-1].all("td")[0].content() == "161 other categories"
    assert "161 other categories" in text


def test_an_empty_month_gets_a_short_friendly_report() -> None:
    summary = summary_factory(count=0, total_cents=0, by_category=(), previous_total_cents=27_934)
    subject, text, html = v2(summary)
    assert subject == "Your October 2026 report: a quiet month"
    document = parse(html)
    assert not document.all("table", "data") and not document.all("td", "bar")
    assert document.all("p", "quiet-title")[0].content() == "A quiet month"
    assert "A quiet month: no activity was recorded in October 2026, after $279.34 in September 2026." in text
    assert "-100" not in html and "-100" not in text and "Change" not in text


@pytest.mark.parametrize(
    "summary",
    [summary_factory(), summary_factory(count=0, total_cents=0, by_category=(), previous_total_cents=0)],
    ids=["a-month-with-activity", "an-empty-month"],
)
def test_the_text_parts_sentence_after_the_greeting_opens_with_a_capital_letter(summary: Summary) -> None:
    _, text, _ = v2(summary)
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    # The greeting ends in a comma, but the next paragraph is a sentence of its own.
    assert paragraphs[1] == "Hello Ada," and paragraphs[2].startswith("Here is "), paragraphs[:3]


@pytest.mark.parametrize(
    ("locale", "currency", "total", "month", "subject_line", "total_line"),
    [
        ("en_US", "USD", "$1,234.56", "October 2026", "Your October 2026 report: {} spent", "Total spent   {}"),
        (
            "de_DE",
            "EUR",
            "1.234,56\xa0€",
            "Oktober 2026",
            "Ihr Bericht für Oktober 2026: {} ausgegeben",
            "Ausgaben gesamt   {}",
        ),
    ],
)
def test_money_and_months_follow_the_locale(
    locale: str, currency: str, total: str, month: str, subject_line: str, total_line: str
) -> None:
    subject, text, html = v2(look=ReportLook(locale=locale, currency=currency))
    document = parse(html)
    assert document.all("p", "kpi-total")[0].content() == total
    assert document.all("td", "header-month")[0].content() == month
    # A subject is one line of plain spaces.
    assert subject == subject_line.format(total.replace(chr(0xA0), " "))
    assert total_line.format(total) in text


def test_the_footer_says_why_and_links_the_unsubscribe_page_or_says_how_to_stop() -> None:
    look = ReportLook(product_name="Acme Ledger", sender_email="reports@acme.test", postal_address="1 Main St")
    _, text, html = v2(look=look, unsubscribe_url=UNSUBSCRIBE)
    [footer] = parse(html).all("td", "footer")
    assert "because your Acme Ledger account has monthly reports turned on" in footer.content()
    assert [a.attrs["href"] for a in footer.all("a")] == [UNSUBSCRIBE]
    assert "Acme Ledger · reports@acme.test · 1 Main St" in footer.content()
    assert f"Unsubscribe: {UNSUBSCRIBE}" in text
    _, text, html = v2(look=look, unsubscribe_url=None)
    [footer] = parse(html).all("td", "footer")
    assert not footer.all("a") and "To stop these reports, reply to this email" in footer.content()
    assert "To stop these reports, reply to this email" in text


def test_a_logo_url_replaces_the_product_name_and_keeps_it_as_alt_text() -> None:
    look = ReportLook(product_name="Acme", logo_url="https://cdn.acme.test/logo.png")
    [img] = parse(v2(look=look)[2]).all("img")
    assert img.attrs["src"] == "https://cdn.acme.test/logo.png" and img.attrs["alt"] == "Acme"


def test_the_text_parts_columns_line_up_in_a_monospace_font() -> None:
    categories = (
        CategoryTotal("travel", 1, 100_000),
        CategoryTotal("食品と飲み物", 12, 2_345),
        CategoryTotal("café", 105, 23_456_789),
    )
    _, text, _ = v2(summary_factory(by_category=categories))
    table = text.split("By category\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[0].split() == ["Category", "Activities", "Amount"]
    ends = {display_width(line) for line in table}
    assert len(ends) == 1, "the amounts do not end in one column"
    counts = {display_width(line.rsplit("  ", 1)[0].rstrip()) for line in table if not line.startswith("-")}
    assert len(counts) == 1, "the counts do not end in one column"
    assert table[2].startswith("café ") and table[3].startswith("travel ") and table[4].startswith("食品と飲み物 ")


@pytest.mark.parametrize(
    ("text", "columns"),
    [
        ("travel", 6),
        ("café", 4),
        ("cafe\u0301", 4),  # e and a combining acute accent
        ("食品", 4),
        ("ที่พัก", 3),  # Thai: a vowel mark and a tone mark above the consonant take no column
        ("a\u200db", 2),  # a zero-width joiner
    ],
)
def test_display_width_counts_the_columns_a_monospace_font_draws(text: str, columns: int) -> None:
    assert display_width(text) == columns


def test_the_v2_subject_is_one_line_with_the_month_and_the_total() -> None:
    assert v2()[0] == "Your October 2026 report: $1,234.56 spent"


def test_the_rendered_html_is_the_same_whatever_the_number_of_renders() -> None:
    assert v2() == v2()


@pytest.mark.parametrize(
    "look",
    [
        pytest.param(ReportLook(), id="en_US"),
        pytest.param(ReportLook(locale="de_DE", currency="EUR"), id="de_DE-with-no-break-spaces-and-euro"),
    ],
)
def test_a_report_travels_unencoded_with_every_line_within_smtps_limit(look: ReportLook) -> None:
    # Quoted-printable would turn every "=" of the inlined styles into "=3D": the HTML is sent as
    # 7bit, its other characters as character references, which needs the template's lines short.
    rendered = render(TEMPLATES, "v2", name="Zoë", summary=many_categories(40), look=look, unsubscribe_url=UNSUBSCRIBE)
    raw = compose(
        rendered,
        to=recipient("zoe@example.com", "Zoë"),
        mail_from="Reports <reports@example.com>",
        period=Period(2026, 10),
        user_id=1,
        date=datetime(2026, 11, 1),
        message_id="<report.2026-10.1@example.com>",
    )
    page = [part for part in email.message_from_bytes(raw, policy=email.policy.default).walk()][-1]
    assert page.get_content_type() == "text/html"
    assert page["Content-Transfer-Encoding"] == "7bit"
    assert html.unescape(page.get_content().replace("\r\n", "\n")) == html.unescape(rendered.html)


def test_a_stylesheet_with_other_characters_than_ascii_is_refused_when_the_template_is_built() -> None:
    with pytest.raises(TemplateBuildError, match="ASCII"):
        inline("<p class='a'>x</p>", ".a { content: '\u2014' }", variables={})
