"""A live Rich progress bar over a period's progress, with rate and time remaining."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from reports.fanout.progress import Progress as PeriodProgress


def watch(read: Callable[[], PeriodProgress], *, interval_seconds: float, console: Console) -> PeriodProgress:
    """Redraw until the period is complete or cancelled; returns the last reading."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8.1f}/s"),
        TextColumn("dead {task.fields[dead]}{task.fields[scheduled]}"),
        TimeRemainingColumn(),
    )
    current = read()
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(
            current.period,
            total=current.total or None,
            completed=current.finished,
            rate=0.0,
            dead=current.dead,
            scheduled=_scheduled(current),
        )
        while not (current.complete or current.cancelled):
            time.sleep(interval_seconds)
            current = read()
            bar.update(
                task,
                total=current.total or None,
                completed=current.finished,
                rate=bar.tasks[0].speed or 0.0,
                dead=current.dead,
                scheduled=_scheduled(current),
            )
        bar.update(task, total=current.total, completed=current.finished)
    return current


def _scheduled(current: PeriodProgress) -> str:
    """Reports waiting for their users' mornings, when there are any."""
    return f"  scheduled {current.scheduled:,}" if current.scheduled else ""
