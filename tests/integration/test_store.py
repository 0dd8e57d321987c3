"""The store port on each database: "there is a report to mail" is one rule, and the claim follows it."""

from __future__ import annotations

from sqlalchemy import text, update
from sqlalchemy.orm import Session, sessionmaker

from reports import items, suppressions
from reports.clock import utcnow
from reports.content.render import RenderedReport
from reports.delivery import claims, pipeline
from reports.delivery.mail.backend import build_mailer
from reports.delivery.store import Inputs, PostgresStore, ReadAndClaim, SqliteStore, StoredReport
from reports.fanout import runs
from reports.models import ItemState, SuppressionReason, User
from reports.periods import Period
from reports.settings import Settings
from tests.integration.conftest import PERIOD, walk_everything
from tests.support.databases import load_users


def _context(settings: Settings, sessions: sessionmaker[Session]) -> pipeline.Context:
    return pipeline.Context(settings=settings, sessions=sessions, mailer=build_mailer(settings))


def _read_and_claim(
    context: pipeline.Context, user_id: int, *, period: Period = PERIOD, empty_month: str = "skip"
) -> Inputs:
    with context.store.transactions() as transaction, transaction() as db:
        return context.store.read_and_claim(
            db,
            ReadAndClaim(
                period,
                user_id,
                message_id=f"<{user_id}@reports.test>",
                lease_seconds=5,
                now=utcnow(),
                empty_month=empty_month,
            ),
        )


def _mailable(context: pipeline.Context, user_id: int, *, empty_month: str = "skip") -> bool:
    """Whether the store says there is a report to mail; the claim is taken exactly then."""
    inputs = _read_and_claim(context, user_id, empty_month=empty_month)
    assert (inputs.claim is not None) == inputs.mailable, inputs
    return inputs.mailable


def test_the_process_picks_its_databases_adapter_once(settings: Settings, sessions: sessionmaker[Session]) -> None:
    expected = SqliteStore if settings.database_url.startswith("sqlite") else PostgresStore
    assert type(_context(settings, sessions).store) is expected


def test_a_report_is_mailable_only_when_every_part_of_the_rule_holds(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    # User i has i % 4 activities in the period (users 4 and 8 none) and one on the first instant
    # after it; user 5 is inactive, so the walk gave them no item.
    load_users(sessions, count=9)
    walk_everything(sessions, settings)
    now = utcnow()
    with sessions.begin() as session:
        items.finish(session, PERIOD, 2, ItemState.DELIVERED, now=now)
        suppressions.add(session, 3, SuppressionReason.UNSUBSCRIBED, now=now, source="test")
        session.execute(update(User).where(User.id == 6).values(active=False))
        # Written by plain SQL in another form than the driver's: the month's first instant counts.
        session.execute(
            text(
                "INSERT INTO activities (user_id, occurred_at, category, amount_cents) "
                "VALUES (8, '2026-10-01T00:00:00', 'food', 100)"
            )
        )
    context = _context(settings, sessions)

    assert {user_id: _mailable(context, user_id) for user_id in range(1, 10)} == {
        1: True,
        2: False,  # already delivered
        3: False,  # suppressed after the walk
        4: False,  # an empty month, and REPORT_EMPTY_MONTH=skip
        5: False,  # no item
        6: False,  # deactivated after the walk
        7: True,
        8: True,
        9: True,
    }
    assert _mailable(context, 4, empty_month="send")


def test_nothing_is_mailable_in_a_cancelled_period(settings: Settings, sessions: sessionmaker[Session]) -> None:
    load_users(sessions, count=3)
    walk_everything(sessions, settings)
    with sessions.begin() as session:
        assert runs.cancel(session, PERIOD, now=utcnow())

    assert not _mailable(_context(settings, sessions), 1)


def test_a_month_never_triggered_or_pruned_reads_as_no_item_and_records_nothing(
    settings: Settings, sessions: sessionmaker[Session]
) -> None:
    # On PostgreSQL such a month has no partitions: the statements name a month's own partitions.
    load_users(sessions, count=1)
    walk_everything(sessions, settings)
    context = _context(settings, sessions)
    month = PERIOD.previous()

    inputs = _read_and_claim(context, 1, period=month, empty_month="send")
    with context.store.transactions() as transaction, transaction() as db:
        recorded = context.store.record_sent(
            db,
            claims.Claim(month, 1, claims.new_token()),
            StoredReport("v1", RenderedReport("Your report", "text", "<p>html</p>"), utcnow()),
            now=utcnow(),
        )

    assert (inputs.item_state, inputs.run_state, inputs.email, inputs.mailable) == (
        None,
        None,
        "user1@example.test",
        False,
    )
    assert not recorded
    assert _mailable(context, 1, empty_month="send")  # the month that has its partitions
