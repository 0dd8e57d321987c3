"""Folding the grouped activity rows into a report's figures: pure arithmetic."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from reports.content.activity import CategoryTotal, Row, summarize
from reports.periods import Period

OCTOBER = Period(2026, 10)


def test_rows_of_the_period_make_the_figures_and_rows_of_the_month_before_make_the_previous_total() -> None:
    rows: list[Row] = [
        (True, "food", 3, 4_500),
        (True, "travel", 1, 12_000),
        (False, "food", 2, 3_000),
        (False, "books", 1, 700),
    ]
    summary = summarize(OCTOBER, rows)
    assert summary.period == OCTOBER
    assert summary.count == 4
    assert summary.total_cents == 16_500
    assert summary.previous_total_cents == 3_700
    assert summary.by_category == (CategoryTotal("travel", 1, 12_000), CategoryTotal("food", 3, 4_500))


def test_a_category_seen_only_in_the_month_before_is_not_listed() -> None:
    summary = summarize(OCTOBER, [(True, "food", 1, 100), (False, "travel", 5, 9_999)])
    assert [c.category for c in summary.by_category] == ["food"]


@pytest.mark.parametrize(
    ("rows", "order"),
    [
        pytest.param(
            [(True, "a", 1, 100), (True, "b", 1, 300), (True, "c", 1, 200)],
            ["b", "c", "a"],
            id="largest-total-first",
        ),
        pytest.param(
            [(True, "travel", 1, 500), (True, "books", 9, 500), (True, "food", 2, 500)],
            ["books", "food", "travel"],
            id="ties-by-name",
        ),
        pytest.param(
            [(True, "zoo", 1, 900), (True, "bar", 1, 500), (True, "abc", 1, 500)],
            ["zoo", "abc", "bar"],
            id="total-then-name",
        ),
        pytest.param(
            [(True, "refund", 1, -300), (True, "food", 1, 0), (True, "fees", 1, 50)],
            ["fees", "food", "refund"],
            id="negative-totals-last",
        ),
        pytest.param([(True, "many", 50, 100), (True, "few", 1, 200)], ["few", "many"], id="total-not-count-decides"),
    ],
)
def test_categories_are_ordered_largest_total_first_then_by_name(rows: list[Row], order: list[str]) -> None:
    assert [c.category for c in summarize(OCTOBER, rows).by_category] == order


def test_no_rows_make_an_empty_summary() -> None:
    summary = summarize(OCTOBER, [])
    assert (summary.count, summary.total_cents, summary.previous_total_cents) == (0, 0, 0)
    assert summary.by_category == ()
    assert summary.change_cents == 0
    assert summary.change_percent is None


@pytest.mark.parametrize(
    ("current", "previous", "change_cents", "change_percent"),
    [
        pytest.param(1_500, 1_000, 500, 50.0, id="growth"),
        pytest.param(500, 1_000, -500, -50.0, id="drop"),
        pytest.param(0, 1_000, -1_000, -100.0, id="nothing-this-month"),
        pytest.param(1_000, 1_000, 0, 0.0, id="unchanged"),
        pytest.param(3_000, 1_000, 2_000, 200.0, id="tripled"),
        pytest.param(1_000, 0, 1_000, None, id="nothing-last-month"),
        pytest.param(0, 0, 0, None, id="nothing-either-month"),
        pytest.param(-500, 0, -500, None, id="refunds-only-this-month"),
        pytest.param(500, -1_000, 1_500, 150.0, id="previous-was-negative"),
    ],
)
def test_change_against_the_previous_month(
    current: int, previous: int, change_cents: int, change_percent: float | None
) -> None:
    rows: list[Row] = [(True, "food", 1, current), (False, "food", 1, previous)]
    summary = summarize(OCTOBER, rows)
    assert summary.change_cents == change_cents
    if change_percent is None:
        assert summary.change_percent is None
    else:
        assert summary.change_percent == pytest.approx(change_percent)


def test_database_numbers_such_as_decimals_become_plain_integers() -> None:
    # PostgreSQL's sum() can come back as Decimal; the figures must be ints for templates and JSON.
    rows: list[Any] = [(True, "food", Decimal(2), Decimal(1250)), (False, "food", 1, Decimal(250))]
    summary = summarize(OCTOBER, rows)
    assert summary.total_cents == 1_250 and type(summary.total_cents) is int
    assert summary.count == 2 and type(summary.count) is int
    assert summary.previous_total_cents == 250 and type(summary.previous_total_cents) is int
    assert type(summary.by_category[0].total_cents) is int


def test_rows_can_be_any_iterable_consumed_once() -> None:
    rows = iter([(True, "food", 2, 300), (False, "food", 1, 100)])
    summary = summarize(OCTOBER, rows)
    assert (summary.count, summary.total_cents, summary.previous_total_cents) == (2, 300, 100)
