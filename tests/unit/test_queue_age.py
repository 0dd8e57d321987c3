"""A RabbitMQ queue's oldest message age, as the exporter works it out (reports/ops/metrics.py)."""

from __future__ import annotations

import pytest

from reports.ops.metrics import waiting_age
from reports.worker.holding import ready_since_ms

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("oldest_waiting_ms", "unseen_since", "expected"),
    [
        # A held message no worker has started: its own age, whatever else is known.
        (int((NOW - 42) * 1000), None, 42.0),
        (int((NOW - 42) * 1000), NOW - 600, 42.0),
        # Ready messages no worker holds: how long the exporter has seen them so, a lower bound.
        (None, NOW - 90, 90.0),
        # Nothing waiting.
        (None, None, 0.0),
        # A clock a little behind the producer's never gives a negative age.
        (int((NOW + 2) * 1000), None, 0.0),
    ],
)
def test_the_oldest_age_is_the_oldest_waiting_held_message_else_the_time_the_queue_has_been_seen_unheld(
    oldest_waiting_ms: int | None, unseen_since: float | None, expected: float
) -> None:
    assert waiting_age(NOW, oldest_waiting_ms=oldest_waiting_ms, unseen_since=unseen_since) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("timestamp_ms", "options", "expected"),
    [
        # Never delayed: since it was enqueued.
        (1_000, {}, 1_000),
        # A retry's backoff or a deferral: since it came due, though its copy kept the first timestamp.
        (1_000, {"eta": 901_000}, 901_000),
        # An eta before the enqueue (a copy enqueued again at once after an earlier delay): the enqueue.
        (901_000, {"eta": 1_000}, 901_000),
        (1_000, {"eta": "soon"}, 1_000),
    ],
)
def test_a_message_is_ready_since_its_enqueue_or_since_its_delay_came_due(
    timestamp_ms: int, options: dict[str, object], expected: int
) -> None:
    assert ready_since_ms(timestamp_ms, options) == expected
