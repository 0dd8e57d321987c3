"""What a RabbitMQ worker process holds: the in-memory record, when its snapshot is written, and
how the fleet's snapshots add up (reports/worker/held.py)."""

from __future__ import annotations

import pytest

from reports.worker.held import (
    PUBLISH_INTERVAL_SECONDS,
    HeldMessages,
    QueueHeld,
    decode,
    due,
    encode,
    held_of,
    totals,
)

CONSUMER, OTHER_CONSUMER = object(), object()


def test_a_held_message_counts_until_it_is_released_and_releasing_it_twice_is_harmless() -> None:
    held = HeldMessages()
    first = held.hold(CONSUMER, "bulk", 1_000, waiting=True)
    held.hold(CONSUMER, "bulk", 2_000, waiting=True)

    assert held.counts() == {"bulk": 2}
    held.release(first)
    held.release(first)
    assert held.counts() == {"bulk": 1}
    assert held.snapshot() == {"bulk": QueueHeld(1, 2_000)}


def test_the_oldest_waiting_message_is_the_oldest_not_yet_started_and_delayed_ones_never_wait() -> None:
    held = HeldMessages()
    oldest = held.hold(CONSUMER, "bulk", 1_000, waiting=True)
    held.hold(CONSUMER, "bulk", 3_000, waiting=True)
    held.hold(CONSUMER, "bulk", 2_000, waiting=True)
    held.hold(CONSUMER, "bulk.DQ", 500, waiting=False)

    held.start(oldest)

    assert held.snapshot() == {"bulk": QueueHeld(3, 2_000), "bulk.DQ": QueueHeld(1, None)}


def test_a_closed_consumers_messages_are_released_and_the_others_stay() -> None:
    held = HeldMessages()
    held.hold(CONSUMER, "bulk", 1_000, waiting=True)
    held.hold(CONSUMER, "bulk.DQ", 1_000, waiting=False)
    kept = held.hold(OTHER_CONSUMER, "bulk", 2_000, waiting=True)

    held.release_all(CONSUMER)

    assert held.counts() == {"bulk": 1}
    held.release(kept)
    assert held.counts() == {}
    assert held.snapshot() == {}


@pytest.mark.parametrize(
    ("written", "counts", "seconds", "expected"),
    [
        # A queue going from nothing held to something is written at once: readers must see it.
        ({}, {"bulk": 1}, 0.0, True),
        ({"bulk": 3}, {"bulk": 3, "critical": 1}, 0.0, True),
        # More of a queue already shown, fewer, or none: at most once per interval.
        ({"bulk": 3}, {"bulk": 8}, 0.0, False),
        ({"bulk": 3}, {"bulk": 8}, PUBLISH_INTERVAL_SECONDS, True),
        ({"bulk": 3}, {}, 0.2, False),
        ({"bulk": 3}, {}, PUBLISH_INTERVAL_SECONDS, True),
        # Unchanged and non-empty: refreshed once per interval, so its TTL does not run out.
        ({"bulk": 3}, {"bulk": 3}, PUBLISH_INTERVAL_SECONDS, True),
        # An idle process writes nothing, however long.
        ({}, {}, 3_600.0, False),
    ],
)
def test_a_snapshot_is_written_when_a_queue_gains_its_first_held_message_or_once_per_interval(
    written: dict[str, int], counts: dict[str, int], seconds: float, expected: bool
) -> None:
    assert due(written, counts, seconds_since_write=seconds) is expected


def test_a_snapshot_reads_back_as_it_was_written() -> None:
    snapshot = {"bulk": QueueHeld(3, 1_700_000_000_000), "bulk.DQ": QueueHeld(2, None)}

    assert decode(encode(snapshot)) == snapshot
    assert decode(encode(snapshot).encode()) == snapshot


def test_the_fleets_figures_add_counts_and_keep_the_oldest_waiting_message_of_all() -> None:
    merged = totals(
        [
            {"bulk": QueueHeld(3, 5_000), "bulk.DQ": QueueHeld(2, None)},
            {"bulk": QueueHeld(1, 4_000), "critical": QueueHeld(1, None)},
            {"bulk": QueueHeld(2, None), "bulk.DQ": QueueHeld(1, None)},
        ]
    )

    assert merged == {"bulk": QueueHeld(6, 4_000), "bulk.DQ": QueueHeld(3, None), "critical": QueueHeld(1, None)}
    assert held_of(merged, "bulk") == 9
    assert held_of(merged, "critical") == 1
    assert held_of(merged, "default") == 0
