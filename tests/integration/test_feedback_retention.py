"""Provider feedback events pruned with the months on both databases: the old ones go with their
matches, the ones a suppression or the soft-bounce window needs stay, and the exporter's event
counters never go down."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from reports.feedback import retention as feedback_retention
from reports.feedback import store
from reports.feedback.events import Event, Kind, Provider
from reports.ops import retention
from reports.periods import Period
from tests.integration.test_feedback_store import POLICY, event
from tests.integration.test_retention import fill_period
from tests.support.databases import load_users

NOW = datetime(2026, 12, 7, 12, 0)
#: With 12 months kept in December 2026, 2025-12 is the oldest month kept.
OLDEST_KEPT = retention.cutoff(NOW, 12)
OLD = datetime(2025, 11, 20)
RECENT = datetime(2026, 11, 20)


def received(sessions: sessionmaker[Session], at: datetime, *found: Event) -> None:
    with sessions.begin() as session:
        store.record(session, list(found), now=at, policy=POLICY)


def stored(sessions: sessionmaker[Session]) -> list[str]:
    with sessions() as session:
        return sorted(session.scalars(text("SELECT event_id FROM feedback_events")))


def counters(sessions: sessionmaker[Session]) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    with sessions() as session:
        return store.count_by_provider_kind(session), store.unmatched_by_provider(session)


@pytest.fixture
def feedback(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    load_users(sessions, count=3)
    received(
        sessions,
        OLD,
        # A complaint suppressed user 1: the console shows it as the reason, so it stays.
        event(Kind.COMPLAINT, "user1@example.test", event_id="old-complaint", occurred_at=OLD),
        event(
            Kind.SOFT_BOUNCE,
            "user2@example.test",
            event_id="old-soft",
            summary="Transient/MailboxFull",
            occurred_at=OLD,
        ),
        event(Kind.HARD_BOUNCE, "stranger@example.test", event_id="old-stranger", occurred_at=OLD),
        event(
            Kind.HARD_BOUNCE, "other@example.test", provider=Provider.POSTMARK, event_id="old-postmark", occurred_at=OLD
        ),
    )
    received(
        sessions,
        RECENT,
        event(Kind.COMPLAINT, "user3@example.test", event_id="recent-complaint", occurred_at=RECENT),
    )
    return sessions


def prune(sessions: sessionmaker[Session], **kw) -> retention.Pruned:  # type: ignore[no-untyped-def]
    return retention.prune(sessions, before=OLDEST_KEPT, now=NOW, **kw)


def test_old_events_go_with_their_matches_and_the_counters_stay(feedback) -> None:
    before = counters(feedback)

    result = prune(feedback, soft_bounce_window=timedelta(days=30))

    assert result.feedback is not None
    assert (result.feedback.deleted, result.feedback.kept_for_suppressions) == (3, 1)
    assert stored(feedback) == ["old-complaint", "recent-complaint"]
    with feedback() as session:
        matched = session.execute(
            text("SELECT e.event_id, m.user_id FROM feedback_matches m JOIN feedback_events e ON e.id = m.event")
        ).all()
        assert sorted(matched) == [("old-complaint", 1), ("recent-complaint", 3)]
        assert session.scalar(text("SELECT count(*) FROM feedback_matches")) == 2
    # Every event ever received is still counted: a counter that went down would read as a restart.
    assert counters(feedback) == before
    assert before[0][("ses", "hard_bounce")] == 1 and before[1] == {
        "ses": 1,
        "sendgrid": 0,
        "postmark": 1,
        "mailgun": 0,
    }

    again = prune(feedback, soft_bounce_window=timedelta(days=30))
    assert again.feedback is not None and again.feedback.deleted == 0
    assert counters(feedback) == before


def test_a_month_kept_whole_because_unfinished_keeps_the_feedback_about_its_emails(feedback) -> None:
    # October 2025, before the oldest month kept, is still running: its rows stay, and so do the
    # bounces and complaints its emails drew (received in November).
    with feedback.begin() as session:
        fill_period(session, "2025-10", pending=2)

    result = prune(feedback)

    assert result.unfinished == ["2025-10"]
    assert stored(feedback) == ["old-complaint", "old-postmark", "old-soft", "old-stranger", "recent-complaint"]
    assert result.feedback is not None and result.feedback.deleted == 0

    # Once it is finished, it goes, and the feedback with it.
    with feedback.begin() as session:
        session.execute(text("UPDATE report_items SET state = 'delivered' WHERE period = '2025-10'"))
    assert prune(feedback).unfinished == []
    assert stored(feedback) == ["old-complaint", "recent-complaint"]


def test_the_soft_bounce_window_keeps_what_it_counts(feedback) -> None:
    result = prune(feedback, soft_bounce_window=timedelta(days=400))
    assert result.feedback is not None and result.feedback.deleted == 0
    assert result.feedback.before == NOW - timedelta(days=400)
    assert len(stored(feedback)) == 5


def test_a_dry_run_counts_what_would_go_and_changes_nothing(feedback) -> None:
    before = counters(feedback)
    result = prune(feedback, dry_run=True)
    assert result.feedback is not None
    assert (result.feedback.deleted, result.feedback.kept_for_suppressions) == (3, 1)
    assert len(stored(feedback)) == 5
    assert counters(feedback) == before


def test_a_prune_stopped_between_batches_finishes_when_run_again(feedback) -> None:
    before = counters(feedback)
    stopped = feedback_retention.prune(feedback, before=OLDEST_KEPT.start, batch_size=1, should_stop=lambda: True)
    assert (stopped.deleted, stopped.finished) == (1, False)
    assert counters(feedback) == before
    rest = feedback_retention.prune(feedback, before=OLDEST_KEPT.start, batch_size=1)
    assert (rest.deleted, rest.finished) == (2, True)
    assert stored(feedback) == ["old-complaint", "recent-complaint"]
    assert counters(feedback) == before


def test_the_cutoff_is_the_older_of_the_oldest_month_kept_and_the_soft_bounce_window() -> None:
    oldest = Period(2025, 12)
    assert feedback_retention.cutoff(oldest, NOW, timedelta(days=30)) == datetime(2025, 12, 1)
    assert feedback_retention.cutoff(oldest, NOW, timedelta(days=400)) == NOW - timedelta(days=400)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_on_postgresql_two_prunes_at_once_delete_each_event_once_and_count_it_once(sessions) -> None:
    load_users(sessions, count=2)
    received(sessions, OLD, *(event(Kind.HARD_BOUNCE, f"gone{i}@example.test", occurred_at=OLD) for i in range(200)))
    before = counters(sessions)
    start = threading.Barrier(2)
    outcomes: list[feedback_retention.Outcome] = []

    def run() -> None:
        start.wait()
        outcomes.append(feedback_retention.prune(sessions, before=OLDEST_KEPT.start, batch_size=7))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(outcome.deleted for outcome in outcomes) == 200
    assert stored(sessions) == []
    assert counters(sessions) == before
    with sessions() as session:
        assert session.scalar(select(text("sum(events)")).select_from(text("feedback_pruned"))) == 200


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("count", [store.count_by_provider_kind, store.unmatched_by_provider])
def test_on_postgresql_a_prune_committed_while_the_exporter_counts_is_counted_once(feedback, count) -> None:
    """The exporter reads its counters beside a prune: the stored events and the pruned ones' counts
    must come from one snapshot, or the events that a prune moves between them are counted twice (and
    the next scrape, a lower value, reads as a counter reset)."""
    with feedback() as session:
        expected = count(session)
    with feedback() as session:
        execute = session.execute
        pruned: list[feedback_retention.Outcome] = []

        def execute_then_prune(*args, **kw):  # type: ignore[no-untyped-def]
            result = execute(*args, **kw)
            if not pruned:
                pruned.append(feedback_retention.prune(feedback, before=OLDEST_KEPT.start, batch_size=100))
            return result

        session.execute = execute_then_prune  # type: ignore[method-assign]
        during = count(session)
    assert pruned and pruned[0].deleted == 3
    assert during == expected


def test_a_soft_bounce_the_window_still_counts_stays_though_its_provider_dated_it_after_it_came(sessions) -> None:
    """The soft-bounce limit counts a user's soft bounces by when they occurred, the provider's time,
    which can be later than when one was received (the provider's clock is ahead of ours)."""
    load_users(sessions, count=2)
    window = timedelta(days=400)
    came = NOW - window - timedelta(minutes=10)
    received(
        sessions,
        came,
        event(Kind.SOFT_BOUNCE, "user2@example.test", event_id="ahead", occurred_at=came + timedelta(minutes=30)),
    )

    def counted() -> int:
        with sessions() as session:
            return store._soft_bounces(session, 2, since=NOW - window)

    assert counted() == 1
    result = prune(sessions, soft_bounce_window=window)
    assert result.feedback is not None and result.feedback.deleted == 0
    assert counted() == 1
