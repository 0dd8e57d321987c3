"""The in-memory queue: what the flows' tests hand them instead of a broker."""

from __future__ import annotations

from reports.jobs import BUILD_REPORT, COORDINATOR, SEND_NOW
from reports.queue import InMemoryQueue


def payload(user_id: int) -> dict[str, object]:
    return {"period": "2026-10", "user_id": user_id, "template_version": "v1"}


def test_jobs_sent_in_one_call_are_one_batch_and_count_in_their_queues_backlog() -> None:
    queue = InMemoryQueue()

    assert queue.send_jobs(BUILD_REPORT, [payload(1), payload(2)]) == 2
    assert queue.send_jobs(BUILD_REPORT, []) == 0
    assert queue.send_jobs(BUILD_REPORT, (payload(n) for n in (3,))) == 1

    assert [[m.args for m in batch] for batch in queue.batches] == [
        [("2026-10", 1, "v1"), ("2026-10", 2, "v1")],
        [("2026-10", 3, "v1")],
    ]
    assert queue.backlog(BUILD_REPORT.queue) == 3
    assert queue.backlog(SEND_NOW.queue) == 0


def test_a_coordinator_message_carries_its_chain_and_its_delay() -> None:
    queue = InMemoryQueue()

    queue.send_coordinator("chain-1", {"period": "2026-10"})
    queue.send_coordinator("chain-1", {"period": "2026-10"}, delay_ms=5_000)

    assert [(m.queue, m.actor, m.args, m.walker, m.delay_ms) for m in queue.of(COORDINATOR)] == [
        ("default", "plan_period", ("2026-10",), "chain-1", None),
        ("default", "plan_period", ("2026-10",), "chain-1", 5_000),
    ]


def test_a_message_enqueued_again_is_a_fresh_message_with_its_own_id() -> None:
    queue = InMemoryQueue()

    first = queue.enqueue_again(queue="bulk", actor="build_report", args=["2026-10", 7, "v1"], kwargs={})
    second = queue.enqueue_again(queue="bulk", actor="build_report", args=["2026-10", 7, "v1"], kwargs={})

    assert first != second
    assert [m.message_id for m in queue.of(BUILD_REPORT)] == [first, second]
