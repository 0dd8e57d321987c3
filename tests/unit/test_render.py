"""Rendering reports from the versioned Jinja2 templates, and the money filters they use."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.content.activity import CategoryTotal, Summary
from reports.content.render import money, render, signed_money
from reports.errors import UnknownTemplateVersion
from reports.periods import Period

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
HOSTILE_NAME = '<script>alert(1)</script> & "x"'


def summary_factory(**overrides: object) -> Summary:
    fields: dict[str, object] = {
        "period": Period(2026, 10),
        "count": 3,
        "total_cents": 123_456,
        "by_category": (CategoryTotal("travel", 1, 100_000), CategoryTotal("food", 2, 23_456)),
        "previous_total_cents": 100_000,
    }
    return Summary(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cents", "text"),
    [
        (0, "0.00"),
        (5, "0.05"),
        (99, "0.99"),
        (100, "1.00"),
        (123_456, "1,234.56"),
        (100_000_000, "1,000,000.00"),
        (-5, "-0.05"),
        (-100, "-1.00"),
        (-123_456, "-1,234.56"),
    ],
)
def test_money_writes_cents_as_units_with_thousands_separators(cents: int, text: str) -> None:
    assert money(cents) == text


@pytest.mark.parametrize(
    ("cents", "text"),
    [
        (0, "0.00"),
        (5, "+0.05"),
        (100, "+1.00"),
        (123_456, "+1,234.56"),
        (-5, "-0.05"),
        (-123_456, "-1,234.56"),
    ],
)
def test_signed_money_marks_gains_with_a_plus_and_zero_with_nothing(cents: int, text: str) -> None:
    assert signed_money(cents) == text


def test_the_v1_templates_render_the_figures_in_both_parts() -> None:
    rendered = render(TEMPLATES, "v1", name="Ada", summary=summary_factory())
    for part in (rendered.text, rendered.html):
        assert "Ada" in part
        assert "October 2026" in part
        assert "1,234.56" in part  # total
        assert "1,000.00" in part  # previous month and the travel category
        assert "+234.56" in part  # change
        assert "+23.5%" in part
        assert "travel" in part and "food" in part
    assert rendered.subject == "Your activity report for October 2026"


def test_the_html_part_escapes_the_users_name() -> None:
    rendered = render(TEMPLATES, "v1", name=HOSTILE_NAME, summary=summary_factory())
    assert "<script>" not in rendered.html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#34;x&#34;" in rendered.html


def test_the_html_part_escapes_category_names() -> None:
    summary = summary_factory(by_category=(CategoryTotal("<b>food</b> & drink", 1, 500),))
    rendered = render(TEMPLATES, "v1", name="Ada", summary=summary)
    assert "<b>food</b>" not in rendered.html
    assert "&lt;b&gt;food&lt;/b&gt; &amp; drink" in rendered.html
    assert "<b>food</b> & drink" in rendered.text


def test_the_text_part_keeps_the_users_name_as_written() -> None:
    rendered = render(TEMPLATES, "v1", name=HOSTILE_NAME, summary=summary_factory())
    assert f"Hello {HOSTILE_NAME}," in rendered.text
    assert "&lt;" not in rendered.text and "&amp;" not in rendered.text


@pytest.mark.parametrize("name", [None, ""])
def test_a_user_without_a_name_is_greeted_as_there(name: str | None) -> None:
    rendered = render(TEMPLATES, "v1", name=name, summary=summary_factory())
    assert "Hello there," in rendered.text
    assert "Hello there," in rendered.html


def test_a_month_without_a_previous_total_shows_no_percentage() -> None:
    rendered = render(TEMPLATES, "v1", name="Ada", summary=summary_factory(previous_total_cents=0))
    assert "Change: +1,234.56\n" in rendered.text
    assert "%" not in rendered.text


def test_the_v1_subject_is_a_single_line() -> None:
    rendered = render(TEMPLATES, "v1", name="Ada", summary=summary_factory())
    assert "\n" not in rendered.subject and "\r" not in rendered.subject
    assert rendered.subject == rendered.subject.strip()


def write_templates(folder: Path, *, subject: str = "Report {{ period }}", skip: str | None = None) -> None:
    folder.mkdir(parents=True)
    parts = {
        "subject.txt.j2": subject,
        "report.txt.j2": "Hi {{ name }}: {{ summary.total_cents | money }}",
        "report.html.j2": "<p>Hi {{ name }}: {{ summary.total_cents | money }}</p>",
    }
    for part, body in parts.items():
        if part != skip:
            (folder / part).write_text(body, encoding="utf-8")


def test_a_subject_template_spanning_lines_still_renders_one_line(tmp_path: Path) -> None:
    write_templates(tmp_path / "v1", subject="\n  Report\n\tfor {{ period }}  \r\n\n")
    rendered = render(tmp_path, "v1", name="Ada", summary=summary_factory())
    assert rendered.subject == "Report for 2026-10"


def test_a_complete_version_folder_of_ones_own_renders(tmp_path: Path) -> None:
    write_templates(tmp_path / "custom")
    rendered = render(tmp_path, "custom", name="<i>Ada</i>", summary=summary_factory())
    assert rendered.subject == "Report 2026-10"
    assert rendered.text == "Hi <i>Ada</i>: 1,234.56"
    assert rendered.html == "<p>Hi &lt;i&gt;Ada&lt;/i&gt;: 1,234.56</p>"


@pytest.mark.parametrize("version", ["v999", "V1", "..", "."])
def test_an_unknown_template_version_is_rejected(version: str) -> None:
    with pytest.raises(UnknownTemplateVersion):
        render(TEMPLATES, version, name="Ada", summary=summary_factory())


@pytest.mark.parametrize("missing", ["subject.txt.j2", "report.txt.j2", "report.html.j2"])
def test_a_version_folder_missing_a_part_is_an_unknown_version(tmp_path: Path, missing: str) -> None:
    write_templates(tmp_path / "v7", skip=missing)
    with pytest.raises(UnknownTemplateVersion, match="'v7'"):
        render(tmp_path, "v7", name="Ada", summary=summary_factory())


def test_an_empty_templates_folder_knows_no_version(tmp_path: Path) -> None:
    with pytest.raises(UnknownTemplateVersion):
        render(tmp_path, "v1", name="Ada", summary=summary_factory())
