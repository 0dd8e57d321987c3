"""`reports feedback list` and the suppression list's provider events as an operator sees them, a
false complaint undone, and bad input refused."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import text

from reports.clock import utcnow
from reports.feedback import store
from reports.feedback.events import Event, Kind, Provider
from tests.support.databases import load_users
from tests.support.processes import run_cli

pytestmark = pytest.mark.acceptance

POLICY = store.Policy(soft_bounce_limit=2, soft_bounce_window=timedelta(days=30))


def received(sessions, *found: Event) -> None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        store.record(session, list(found), now=utcnow(), policy=POLICY)


def event(provider: Provider, event_id: str, kind: Kind, address: str, **kw) -> Event:  # type: ignore[no-untyped-def]
    return Event(provider, event_id, kind, address, utcnow(), kw.pop("summary", "test"), **kw)


def cli_json(settings, *args: str) -> list[dict]:  # type: ignore[no-untyped-def]
    result = run_cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_operator_sees_the_events_and_the_suppressions_they_made_and_undoes_a_false_complaint(settings, sessions):
    load_users(sessions, count=4, inactive_every=100)
    received(
        sessions,
        event(Provider.SENDGRID, "sg-1", Kind.COMPLAINT, "user2@example.test", summary="spamreport"),
        event(Provider.MAILGUN, "mg-1", Kind.HARD_BOUNCE, "user3@example.test", user_id=3, period="2026-10"),
        event(Provider.SES, "ses-1", Kind.HARD_BOUNCE, "nobody@example.test"),
    )

    listed = cli_json(settings, "suppress", "list")
    assert [(r["user_id"], r["reason"], r["provider"], r["event_id"]) for r in listed] == [
        (2, "complained", "sendgrid", "sg-1"),
        (3, "bounced", "mailgun", "mg-1"),
    ]
    plain = run_cli(settings, "suppress", "list")
    assert "sendgrid event sg-1" in plain.stdout and "2 suppressed user(s)." in plain.stdout

    events = cli_json(settings, "feedback", "list")
    assert {(r["provider"], r["event_id"], r["user_id"]) for r in events} == {
        ("sendgrid", "sg-1", 2),
        ("mailgun", "mg-1", 3),
        ("ses", "ses-1", None),
    }
    assert [r["event_id"] for r in cli_json(settings, "feedback", "list", "--provider", "mailgun")] == ["mg-1"]
    assert [r["event_id"] for r in cli_json(settings, "feedback", "list", "--kind", "complaint")] == ["sg-1"]
    assert [r["event_id"] for r in cli_json(settings, "feedback", "list", "--period", "2026-10")] == ["mg-1"]
    assert [r["event_id"] for r in cli_json(settings, "feedback", "list", "--user", "2")] == ["sg-1"]
    assert len(cli_json(settings, "feedback", "list", "--limit", "1")) == 1
    plain = run_cli(settings, "feedback", "list")
    assert "unmatched" in plain.stdout and "3 event(s)." in plain.stdout

    # User 2's complaint was a mistake: lifted, and the event dismissed so it counts no more.
    removed = run_cli(settings, "suppress", "remove", "2")
    assert removed.returncode == 0, removed.stderr
    assert "1 provider feedback event(s) dismissed" in removed.stdout
    assert [r["user_id"] for r in cli_json(settings, "suppress", "list")] == [3]
    [dismissed] = cli_json(settings, "feedback", "list", "--user", "2")
    assert dismissed["dismissed"] is True
    # The provider retrying the same event does not suppress the user again.
    received(sessions, event(Provider.SENDGRID, "sg-1", Kind.COMPLAINT, "user2@example.test"))
    assert [r["user_id"] for r in cli_json(settings, "suppress", "list")] == [3]


@pytest.mark.parametrize(
    "args",
    [
        ("--provider", "yahoo"),
        ("--kind", "bounce"),
        ("--period", "2026-13"),
        ("--user", "2147483648"),  # past the 32-bit ids (0 and negative ids are users)
        ("--user", "x"),
        ("--limit", "0"),
    ],
)
def test_bad_input_is_one_line_exit_2(settings, sessions, args):
    result = run_cli(settings, "feedback", "list", *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error:"), result.stderr
    with sessions() as session:
        assert session.scalar(text("SELECT count(*) FROM feedback_events")) == 0
