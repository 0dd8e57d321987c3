"""Provider feedback on both databases: each event stored once, matched to its users, and applied
to the suppression list; soft bounces counted; a period's complaints counted; replayed tokens seen."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text

from reports.clock import utcnow
from reports.feedback import store
from reports.feedback.events import Event, Kind, Provider
from reports.models import Suppression
from tests.integration.conftest import make_partitions
from tests.support.databases import load_users

POLICY = store.Policy(soft_bounce_limit=3, soft_bounce_window=timedelta(days=30))
_ids = itertools.count(1)


def event(kind: Kind, address: str, *, provider: Provider = Provider.SES, event_id: str | None = None, **kw) -> Event:  # type: ignore[no-untyped-def]
    return Event(
        provider=provider,
        event_id=event_id or f"event-{next(_ids)}",
        kind=kind,
        address=address,
        occurred_at=kw.pop("occurred_at", utcnow()),
        summary=kw.pop("summary", "Permanent/General 5.1.1"),
        **kw,
    )


def record(sessions, *found: Event) -> store.Recorded:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        return store.record(session, list(found), now=utcnow(), policy=POLICY)


def suppressed(sessions) -> dict[int, tuple[str, str | None, str | None, str | None]]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return {s.user_id: (s.reason, s.source, s.provider, s.event_id) for s in session.scalars(select(Suppression))}


def test_a_hard_bounce_suppresses_its_user_with_the_reason_provider_and_event_and_a_retry_changes_nothing(sessions):
    load_users(sessions, count=3)
    bounce = event(Kind.HARD_BOUNCE, "user2@example.test", event_id="0100-feedback-1")

    assert record(sessions, bounce) == store.Recorded(stored=1, suppressed=(2,))
    assert suppressed(sessions) == {2: ("bounced", "ses Permanent/General 5.1.1", "ses", "0100-feedback-1")}

    assert record(sessions, bounce) == store.Recorded(duplicates=1)
    with sessions() as session:
        assert session.scalar(text("SELECT count(*) FROM feedback_events")) == 1
        assert session.scalar(text("SELECT count(*) FROM feedback_matches")) == 1


def test_the_same_event_id_from_another_provider_is_another_event(sessions):
    load_users(sessions, count=3)
    record(sessions, event(Kind.COMPLAINT, "user1@example.test", event_id="42"))
    assert (
        record(sessions, event(Kind.COMPLAINT, "user3@example.test", provider=Provider.POSTMARK, event_id="42")).stored
        == 1
    )
    assert sorted(suppressed(sessions)) == [1, 3]


def test_an_address_matches_whatever_its_case_and_every_user_who_shares_it(sessions):
    load_users(sessions, count=4)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'Shared@Example.TEST' WHERE id IN (1, 4)"))
    recorded = record(sessions, event(Kind.COMPLAINT, "shared@example.test", summary="complaint abuse"))
    assert recorded.suppressed == (1, 4)
    assert {user: reason for user, (reason, *_rest) in suppressed(sessions).items()} == {
        1: "complained",
        4: "complained",
    }


def test_the_user_the_headers_name_is_the_one_matched_even_after_a_change_of_address(sessions):
    load_users(sessions, count=4)
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'new3@example.test' WHERE id = 3"))
    # The bounce is about the address the email went to, which another user now has.
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'user3@example.test' WHERE id = 2"))
    assert record(sessions, event(Kind.HARD_BOUNCE, "user3@example.test", user_id=3, period="2026-10")).suppressed == (
        3,
    )
    assert list(suppressed(sessions)) == [3]


def test_an_event_about_nobody_is_stored_and_counted_as_unmatched(sessions):
    load_users(sessions, count=2)
    assert record(sessions, event(Kind.HARD_BOUNCE, "stranger@example.test")) == store.Recorded(stored=1, unmatched=1)
    assert suppressed(sessions) == {}
    with sessions() as session:
        assert store.unmatched_by_provider(session)["ses"] == 1
        assert store.count_by_provider_kind(session)[("ses", "hard_bounce")] == 1
        [listed] = store.find(session)
    assert (listed.user_id, listed.address) == (None, "stranger@example.test")


def test_soft_bounces_suppress_at_the_limit_within_the_window_only(sessions):
    load_users(sessions, count=2)
    old = utcnow() - timedelta(days=31)
    soft = lambda **kw: event(Kind.SOFT_BOUNCE, "user1@example.test", summary="Transient/MailboxFull", **kw)  # noqa: E731
    assert record(sessions, soft(occurred_at=old), soft(occurred_at=old)).suppressed == ()
    assert record(sessions, soft(), soft()).suppressed == ()
    assert suppressed(sessions) == {}
    third = soft()
    assert record(sessions, third).suppressed == (1,)
    assert suppressed(sessions) == {1: ("bounced", "ses 3 soft bounces in 30 days", "ses", third.event_id)}


def test_a_providers_retries_of_one_email_are_one_soft_bounce_and_three_months_emails_are_three(sessions):
    load_users(sessions, count=2)
    soft = lambda period: event(  # noqa: E731
        Kind.SOFT_BOUNCE,
        "user1@example.test",
        provider=Provider.MAILGUN,
        summary="failed temporary",
        user_id=1,
        period=period,
    )
    # Mailgun's temporary failure of October's email, posted again on each of its retries.
    assert record(sessions, soft("2026-10"), soft("2026-10"), soft("2026-10")).suppressed == ()
    assert record(sessions, soft("2026-10")).suppressed == ()
    assert suppressed(sessions) == {}
    assert record(sessions, soft("2026-08"), soft("2026-09")).suppressed == (1,)
    assert suppressed(sessions)[1][:2] == ("bounced", "mailgun 3 soft bounces in 30 days")


def test_a_dismissed_users_feedback_no_longer_counts(sessions):
    load_users(sessions, count=2)
    soft = lambda: event(Kind.SOFT_BOUNCE, "user1@example.test", period="2026-10", user_id=1)  # noqa: E731
    record(sessions, soft(), soft(), event(Kind.COMPLAINT, "user1@example.test", user_id=1, period="2026-10"))
    with sessions.begin() as session:
        assert store.users_by_period(session, ["2026-10"]) == {"2026-10": {"soft_bounce": 1, "complaint": 1}}
        assert store.dismiss(session, 1, now=utcnow()) == 3
        session.execute(text("DELETE FROM suppressions"))
    with sessions() as session:
        assert store.users_by_period(session, ["2026-10"]) == {"2026-10": {}}
    # Two new soft bounces: the dismissed ones do not bring them to the limit.
    assert record(sessions, soft(), soft()).suppressed == ()


def test_a_complaint_without_headers_counts_against_the_period_of_the_users_last_email(sessions):
    load_users(sessions, count=3)
    sent = utcnow() - timedelta(days=3)
    make_partitions(sessions, "2026-09", "2026-10")
    with sessions.begin() as session:
        for period in ("2026-09", "2026-10"):
            session.execute(
                text(
                    "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at, updated_at)"
                    " VALUES (:p, 'active', 'v1', 0, true, :at, :at)"
                ),
                {"p": period, "at": sent},
            )
            session.execute(
                text(
                    "INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at,"
                    " times_taken, claimed_at, sent_at) VALUES (:p, 2, 'sent', 'm', 't', :at, 1, :at, :at)"
                ),
                {"p": period, "at": sent - timedelta(days=30 if period == "2026-09" else 0)},
            )
    record(sessions, event(Kind.COMPLAINT, "user2@example.test"), event(Kind.COMPLAINT, "user3@example.test"))
    with sessions() as session:
        assert store.users_by_period(session, ["2026-09", "2026-10"]) == {"2026-09": {}, "2026-10": {"complaint": 1}}
        assert [(row.user_id, row.period) for row in store.find(session, kind="complaint")] == [
            (3, None),
            (2, "2026-10"),
        ]


def test_a_signature_token_is_taken_once_and_forgotten_once_stale(sessions):
    now = utcnow()
    keep = timedelta(minutes=10)
    with sessions.begin() as session:
        assert store.remember_token(session, Provider.MAILGUN, "t1", now=now - timedelta(minutes=11), keep=keep)
        assert store.remember_token(session, Provider.MAILGUN, "t2", now=now, keep=keep)
    with sessions.begin() as session:
        assert not store.remember_token(session, Provider.MAILGUN, "t2", now=now, keep=keep)
        # t1 was pruned as stale (a signature carrying it is refused for its age anyway).
        assert store.remember_token(session, Provider.MAILGUN, "t1", now=now, keep=keep)


@pytest.mark.parametrize(
    "filters", [{"provider": "mailgun"}, {"kind": "unsubscribe"}, {"user_id": 2}, {"period": "2026-10"}]
)
def test_the_listing_filters(sessions, filters):
    load_users(sessions, count=3)
    record(
        sessions,
        event(Kind.UNSUBSCRIBE, "user1@example.test", provider=Provider.MAILGUN),
        event(Kind.HARD_BOUNCE, "user2@example.test", user_id=2, period="2026-10"),
    )
    with sessions() as session:
        [listed] = store.find(session, **filters)
    assert listed.user_id == (1 if set(filters) & {"provider", "kind"} else 2)


def test_with_the_default_window_three_monthly_reports_soft_bounced_in_a_row_suppress(sessions, settings):
    policy = store.Policy(soft_bounce_limit=settings.soft_bounce_limit, soft_bounce_window=settings.soft_bounce_window)
    load_users(sessions, count=2)
    # Each report goes out on the 1st; its soft bounce comes back the same morning.
    sent = [datetime(2026, 9, 1, 9), datetime(2026, 10, 1, 9), datetime(2026, 11, 1, 9)]
    outcomes = []
    for moment in sent:
        soft = event(Kind.SOFT_BOUNCE, "user1@example.test", user_id=1, period=f"{moment:%Y-%m}", occurred_at=moment)
        with sessions.begin() as session:
            outcomes.append(store.record(session, [soft], now=moment, policy=policy).suppressed)
    assert outcomes == [(), (), (1,)]
