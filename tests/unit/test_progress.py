"""A period's progress figures, as ``reports progress --json`` prints them."""

from __future__ import annotations

import json

import pytest

from reports.fanout.progress import Progress


def progress_factory(**overrides: object) -> Progress:
    fields: dict[str, object] = {
        "period": "2026-10",
        "total": 10,
        "planned": True,
        "delivered": 6,
        "skipped": 2,
        "dead": 1,
        "pending": 1,
    }
    return Progress(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("planned", "pending", "complete"),
    [
        pytest.param(True, 0, True, id="planned-nothing-pending"),
        pytest.param(True, 1, False, id="planned-one-pending"),
        pytest.param(False, 0, False, id="still-walking-nothing-pending"),
        pytest.param(False, 5, False, id="still-walking-some-pending"),
    ],
)
def test_a_period_is_complete_when_planned_and_nothing_is_pending(planned: bool, pending: int, complete: bool) -> None:
    progress = progress_factory(planned=planned, pending=pending, delivered=9 - pending, total=12)
    assert progress.complete is complete


def test_as_dict_has_exactly_the_contracts_keys_and_the_runs_state() -> None:
    assert set(progress_factory().as_dict()) == {
        "period",
        "total",
        "planned",
        "delivered",
        "skipped",
        "dead",
        "pending",
        "state",
        "complete",
    }


def test_as_dict_carries_the_figures_and_the_completion() -> None:
    assert progress_factory().as_dict() == {
        "period": "2026-10",
        "total": 10,
        "planned": True,
        "delivered": 6,
        "skipped": 2,
        "dead": 1,
        "pending": 1,
        "state": "active",
        "complete": False,
    }
    assert progress_factory(pending=0, delivered=7).as_dict()["complete"] is True


def test_finished_counts_the_items_in_a_final_state() -> None:
    progress = progress_factory(delivered=6, skipped=2, dead=1, pending=1)
    assert progress.finished == 9
    assert progress.finished + progress.pending == progress.total


def test_as_dict_is_a_json_object_with_real_booleans() -> None:
    printed = json.loads(json.dumps(progress_factory(pending=0, delivered=7).as_dict()))
    assert printed["planned"] is True
    assert printed["complete"] is True
    assert printed["period"] == "2026-10"


@pytest.mark.parametrize(
    ("state", "pending", "status"),
    [("active", 1, "active"), ("active", 0, "complete"), ("cancelled", 1, "cancelled"), ("cancelled", 0, "cancelled")],
)
def test_status_is_complete_only_for_an_active_run_with_nothing_pending(state: str, pending: int, status: str) -> None:
    counts = progress_factory(state=state, pending=pending, delivered=10 - pending - 3)
    assert (counts.status, counts.cancelled) == (status, state == "cancelled")
