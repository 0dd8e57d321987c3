"""Period arithmetic: parsing ``YYYY-MM`` strictly, stepping across years, and closed periods."""

from __future__ import annotations

from datetime import datetime

import pytest

from reports.errors import BadInput
from reports.periods import Period, parse_closed, previous_month


@pytest.mark.parametrize(
    ("text", "year", "month"),
    [
        ("2026-10", 2026, 10),
        ("2026-01", 2026, 1),
        ("2026-12", 2026, 12),
        ("1970-01", 1970, 1),
        ("2099-07", 2099, 7),
    ],
)
def test_a_well_formed_period_is_parsed_into_its_year_and_month(text: str, year: int, month: int) -> None:
    period = Period.parse(text)
    assert (period.year, period.month) == (year, month)
    assert str(period) == text


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2026-1", id="one-digit-month"),
        pytest.param("2026/10", id="slash"),
        pytest.param("26-10", id="two-digit-year"),
        pytest.param("202610", id="no-dash"),
        pytest.param("2026-10-01", id="a-date"),
        pytest.param("2026-", id="no-month"),
        pytest.param("-10", id="no-year"),
        pytest.param("abcd-ef", id="letters"),
        pytest.param("+2026-10", id="signed-year"),
        pytest.param("", id="empty"),
        pytest.param(" ", id="blank"),
        pytest.param(" 2026-10", id="leading-space"),
        pytest.param("2026-10 ", id="trailing-space"),
        pytest.param("2026-10\n", id="trailing-newline"),
        pytest.param("\u0662\u0660\u0662\u0666-\u0661\u0660", id="arabic-indic-digits"),
        pytest.param("\uff12\uff10\uff12\uff16-\uff11\uff10", id="fullwidth-digits"),
    ],
)
def test_a_malformed_period_is_rejected(text: str) -> None:
    with pytest.raises(BadInput, match="expected YYYY-MM"):
        Period.parse(text)


@pytest.mark.parametrize("text", ["2026-13", "2026-00", "2026-99", "1969-12", "0202-10", "0000-01"])
def test_a_month_that_does_not_exist_is_rejected(text: str) -> None:
    with pytest.raises(BadInput, match="no such month"):
        Period.parse(text)


@pytest.mark.parametrize("value", [None, 202610, 2026.10, b"2026-10", ["2026-10"], Period(2026, 10)])
def test_a_value_that_is_not_a_string_is_rejected(value: object) -> None:
    with pytest.raises(BadInput):
        Period.parse(value)  # type: ignore[arg-type]


def test_the_rejection_message_quotes_the_input_and_gives_an_example() -> None:
    with pytest.raises(BadInput) as caught:
        Period.parse("2026/10")
    assert "'2026/10'" in str(caught.value)
    assert "2026-10" in str(caught.value)


@pytest.mark.parametrize(
    ("period", "following"),
    [
        (Period(2026, 1), Period(2026, 2)),
        (Period(2026, 10), Period(2026, 11)),
        (Period(2026, 11), Period(2026, 12)),
        (Period(2026, 12), Period(2027, 1)),
        (Period(1999, 12), Period(2000, 1)),
    ],
)
def test_next_and_previous_step_one_month_across_year_boundaries(period: Period, following: Period) -> None:
    assert period.next() == following
    assert following.previous() == period


@pytest.mark.parametrize("month", range(1, 13))
def test_next_then_previous_returns_the_same_month(month: int) -> None:
    period = Period(2026, month)
    assert period.next().previous() == period
    assert period.previous().next() == period


@pytest.mark.parametrize(
    ("period", "start", "end"),
    [
        (Period(2026, 10), datetime(2026, 10, 1), datetime(2026, 11, 1)),
        (Period(2026, 12), datetime(2026, 12, 1), datetime(2027, 1, 1)),
        (Period(2026, 1), datetime(2026, 1, 1), datetime(2026, 2, 1)),
        (Period(2024, 2), datetime(2024, 2, 1), datetime(2024, 3, 1)),
    ],
)
def test_start_and_end_bound_the_month_as_naive_utc_datetimes(period: Period, start: datetime, end: datetime) -> None:
    assert period.start == start
    assert period.end == end
    assert period.start.tzinfo is None and period.end.tzinfo is None


def test_the_end_of_one_month_is_the_start_of_the_next() -> None:
    period = Period(2026, 12)
    assert period.end == period.next().start


@pytest.mark.parametrize(
    ("period", "label"),
    [
        (Period(2026, 10), "October 2026"),
        (Period(1970, 1), "January 1970"),
        (Period(2027, 12), "December 2027"),
    ],
)
def test_the_label_names_the_month_and_year(period: Period, label: str) -> None:
    assert period.label() == label


def test_periods_order_by_year_then_month() -> None:
    assert Period(2025, 12) < Period(2026, 1) < Period(2026, 2)
    assert sorted([Period(2026, 2), Period(2025, 12), Period(2026, 1)]) == [
        Period(2025, 12),
        Period(2026, 1),
        Period(2026, 2),
    ]


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (datetime(2026, 11, 1, 0, 0, 0), Period(2026, 10)),
        (datetime(2026, 11, 30, 23, 59, 59), Period(2026, 10)),
        (datetime(2026, 1, 15, 12, 0), Period(2025, 12)),
        (datetime(2027, 1, 1, 0, 0), Period(2026, 12)),
        (datetime(2026, 3, 1, 0, 0), Period(2026, 2)),
    ],
)
def test_previous_month_is_the_month_that_ended_most_recently(now: datetime, expected: Period) -> None:
    assert previous_month(now) == expected


@pytest.mark.parametrize(
    ("text", "now"),
    [
        ("2026-10", datetime(2026, 11, 1, 0, 0)),
        ("2026-10", datetime(2026, 11, 30, 23, 59)),
        ("2025-11", datetime(2026, 11, 5)),
        ("2026-12", datetime(2027, 1, 1, 0, 0)),
    ],
)
def test_a_month_that_has_ended_is_accepted_as_closed(text: str, now: datetime) -> None:
    assert parse_closed(text, now) == Period.parse(text)


@pytest.mark.parametrize(
    ("text", "now", "latest"),
    [
        pytest.param("2026-11", datetime(2026, 11, 5), "2026-10", id="current-month"),
        pytest.param("2026-11", datetime(2026, 11, 1, 0, 0), "2026-10", id="current-month-first-instant"),
        pytest.param("2026-12", datetime(2026, 11, 5), "2026-10", id="next-month"),
        pytest.param("2027-01", datetime(2026, 11, 5), "2026-10", id="next-year"),
        pytest.param("2027-01", datetime(2027, 1, 1, 0, 0), "2026-12", id="current-month-across-new-year"),
    ],
)
def test_the_current_or_a_future_month_is_rejected_naming_the_latest_allowed(
    text: str, now: datetime, latest: str
) -> None:
    with pytest.raises(BadInput) as caught:
        parse_closed(text, now)
    assert f"latest period that can be reported is {latest}" in str(caught.value)


def test_parse_closed_rejects_a_malformed_period_too() -> None:
    with pytest.raises(BadInput, match="expected YYYY-MM"):
        parse_closed("2026-1", datetime(2026, 11, 5))
