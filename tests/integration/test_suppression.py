"""The suppression list on both databases: suppressed users are not planned, a job finds one
suppressed after the walk and skips them, a hard bounce suppresses, and every email carries the
user's one-click unsubscribe link."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import select

from reports import suppressions, tokens
from reports.clock import utcnow
from reports.delivery import pipeline
from reports.delivery.mail.backend import build_mailer
from reports.errors import MailRejected
from reports.fanout import progress
from reports.jobs import ReportJob
from reports.models import ItemState, ReportItem, SuppressionReason
from tests.integration.conftest import PERIOD, RecordingQueue, walk_everything
from tests.support.databases import load_users

#: In-process sends: room for the claim and the render (tests/conftest.py says why).
pytestmark = pytest.mark.claim_lease_seconds(10)


@pytest.fixture
def context(settings, sessions, smtp_server) -> pipeline.Context:  # type: ignore[no-untyped-def]
    mail_settings = replace(settings, smtp_url=smtp_server.url, template_version="v2")
    return pipeline.Context(settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings))


def suppress(sessions, user_id: int, reason: SuppressionReason = SuppressionReason.UNSUBSCRIBED) -> None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        assert suppressions.add(session, user_id, reason, now=utcnow(), source="test")


def item_states(sessions) -> dict[int, str]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return dict(
            session.execute(select(ReportItem.user_id, ReportItem.state).where(ReportItem.period == str(PERIOD))).all()
        )


def test_the_coordinator_does_not_plan_suppressed_users(settings, sessions):
    population = load_users(sessions, count=20)  # page size 7: suppressed users on several pages
    for user_id in (1, 7, 8, 13):
        suppress(sessions, user_id, SuppressionReason.COMPLAINED if user_id == 13 else SuppressionReason.UNSUBSCRIBED)
    queue = RecordingQueue()

    walk_everything(sessions, settings, queue=queue)

    expected = sorted(set(population.active) - {1, 7, 8, 13})
    assert sorted(queue.user_ids) == expected
    assert sorted(item_states(sessions)) == expected


def test_a_user_suppressed_after_planning_is_skipped_and_progress_counts_them(settings, sessions, context, smtp_server):
    load_users(sessions, count=4)
    walk_everything(sessions, settings)
    suppress(sessions, 3)

    outcome = pipeline.run(context, ReportJob(PERIOD, 3, "v2"))

    assert outcome == pipeline.Outcome.SKIPPED
    assert smtp_server.messages == []
    assert item_states(sessions)[3] == ItemState.SKIPPED
    with sessions() as session:
        counted = progress.count(session, PERIOD)
    assert (counted.skipped, counted.pending) == (1, 3)


def test_every_email_carries_the_users_signed_one_click_unsubscribe_link(settings, sessions, context, smtp_server):
    load_users(sessions, count=2)
    walk_everything(sessions, settings)

    assert pipeline.run(context, ReportJob(PERIOD, 2, "v2")) == pipeline.Outcome.DELIVERED

    [message] = smtp_server.messages
    url = tokens.links(settings).url(2)
    assert url.startswith("http://127.0.0.1:8000/u/2.")
    assert message["List-Unsubscribe"] == f"<{url}>"
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert tokens.links(settings).signer.user_id(url.rsplit("/", 1)[1]) == 2
    assert f'href="{url}"' in message.get_body(("html",)).get_content()
    assert url in message.get_body(("plain",)).get_content()


def test_a_5xx_to_rcpt_to_suppresses_the_user_as_bounced(settings, sessions, context, smtp_server):
    load_users(sessions, count=3)
    walk_everything(sessions, settings)
    smtp_server.handler.rcpt_fault = lambda address: (
        "550 5.1.1 No such user here" if address.startswith("user2@") else None
    )

    with pytest.raises(MailRejected) as rejected:
        pipeline.run(context, ReportJob(PERIOD, 2, "v2"))

    assert rejected.value.recipient
    with sessions() as session:
        entry = suppressions.get(session, 2)
        assert entry is not None and entry.reason == SuppressionReason.BOUNCED and entry.source == "smtp 550"
        assert suppressions.get(session, 1) is None


def test_a_5xx_to_the_content_does_not_suppress_the_user(settings, sessions, context, smtp_server):
    """The message was refused, not the address (a content filter): the next month may pass."""
    load_users(sessions, count=3)
    walk_everything(sessions, settings)
    smtp_server.handler.fault = lambda recipient, attempt: "554 5.7.1 Message rejected as spam"

    with pytest.raises(MailRejected) as rejected:
        pipeline.run(context, ReportJob(PERIOD, 2, "v2"))

    assert not rejected.value.recipient
    with sessions() as session:
        assert suppressions.get(session, 2) is None
