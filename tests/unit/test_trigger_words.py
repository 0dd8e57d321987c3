"""What a trigger says it did (``reports trigger``, the console), decided from the run and its counts alone."""

from __future__ import annotations

from reports.fanout.progress import Progress
from reports.fanout.runs import Triggered
from reports.models import PeriodRun, RunState


def planned_run() -> PeriodRun:
    return PeriodRun(period="2026-11", state=RunState.ACTIVE, template_version="v2", cursor=42, planned=True)


def counts(*, delivered: int, pending: int, dead: int = 0) -> Progress:
    total = delivered + pending + dead
    return Progress("2026-11", total=total, planned=True, delivered=delivered, skipped=0, dead=dead, pending=pending)


def test_a_complete_period_triggered_again_says_it_is_complete_and_that_nothing_was_sent() -> None:
    line = Triggered(run=planned_run(), created=False, counts=counts(delivered=1_264, pending=0, dead=2)).describe()
    assert line == "2026-11 is already complete (1,264 delivered, 0 skipped, 2 dead); nothing enqueued, nothing sent."
    assert "resum" not in line


def test_a_planned_period_still_sending_says_it_is_planned_and_nothing_was_enqueued() -> None:
    line = Triggered(run=planned_run(), created=False, counts=counts(delivered=10, pending=5)).describe()
    assert line == "2026-11 is already planned; nothing enqueued."
