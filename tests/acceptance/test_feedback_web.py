"""Provider webhooks sent to the real `reports web` process, signed with keys the tests make: each
provider's bounces and complaints suppress exactly their users, forged, stale and replayed ones
change nothing, an unconfigured provider is a 404, and the next period mails everyone else once."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text, update

from reports.clock import utcnow
from reports.feedback import ses
from reports.feedback.sendgrid import SIGNATURE_HEADER as SIGNATURE
from reports.feedback.sendgrid import TIMESTAMP_HEADER as TIMESTAMP
from reports.feedback.web import MAX_BODY_BYTES
from reports.models import WebhookToken
from tests.support.databases import load_users
from tests.support.feedback import (
    MAILGUN_KEY,
    POSTMARK_AUTH,
    TOPIC_ARN,
    Pki,
    SnsServer,
    mailgun_event,
    mailgun_post,
    other_form,
    postmark_authorization,
    postmark_bounce,
    postmark_complaint,
    sendgrid_event,
    sendgrid_headers,
    sendgrid_public_key,
    ses_notification,
    sns_server,
)
from tests.support.processes import run_cli, wait_for_progress
from tests.support.web import WebProcess

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"


@pytest.fixture
def sns(tmp_path):  # type: ignore[no-untyped-def]
    with sns_server(tmp_path) as server:
        yield server


@pytest.fixture
def providers() -> tuple[str, ...]:
    """The providers configured; a test parametrizes it to leave some out."""
    return ("ses", "sendgrid", "postmark", "mailgun")


@pytest.fixture
def settings(settings, sns, providers):  # type: ignore[no-untyped-def]
    """The test's settings with the providers configured, SNS trusted through the tests' CA."""
    return replace(
        settings,
        ses_topic_arns=TOPIC_ARN if "ses" in providers else "",
        sendgrid_webhook_public_key=sendgrid_public_key() if "sendgrid" in providers else "",
        postmark_webhook_auth=":".join(POSTMARK_AUTH) if "postmark" in providers else "",
        mailgun_webhook_signing_key=MAILGUN_KEY if "mailgun" in providers else "",
        sns_test_ca_file=str(sns.pki.ca_file),
    )


def post(web: WebProcess, path: str, body: bytes | dict[str, Any] | list[Any], **headers: str) -> int:
    """POST to the web process; the status."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(web.base_url.removeprefix("http://"), timeout=10)
    try:
        connection.request("POST", path, body=raw, headers={"Content-Type": "application/json", **headers})
        return connection.getresponse().status
    finally:
        connection.close()


def post_oversized(web: WebProcess, path: str, *, chunked: bool) -> int:
    """A body one byte over the cap: announced by its Content-Length (and not sent), or sent chunked."""
    connection = http.client.HTTPConnection(web.base_url.removeprefix("http://"), timeout=10)
    try:
        if chunked:
            chunks = (b" " * 65536 for _ in range(MAX_BODY_BYTES // 65536 + 1))
            connection.request("POST", path, body=chunks, encode_chunked=True)
        else:
            connection.putrequest("POST", path)
            connection.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
            connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def post_ses(web: WebProcess, message: dict[str, str]) -> int:
    return post(web, "/hooks/ses", message, **{"x-amz-sns-message-type": message["Type"]})


def post_sendgrid(web: WebProcess, events: list[dict[str, Any]], *, at: int | None = None) -> int:
    body = json.dumps(events).encode()
    return post(web, "/hooks/sendgrid", body, **sendgrid_headers(body, at or int(time.time())))


def post_postmark(web: WebProcess, record: dict[str, Any]) -> int:
    return post(web, "/hooks/postmark", record, Authorization=postmark_authorization())


def suppressed(sessions) -> dict[int, tuple[str, str]]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return {
            user: (reason, provider)
            for user, reason, provider in session.execute(text("SELECT user_id, reason, provider FROM suppressions"))
        }


def stored_events(sessions) -> int:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return int(session.scalar(text("SELECT count(*) FROM feedback_events")) or 0)


def suppress_one_user_per_way(web: WebProcess, sns: SnsServer) -> list[tuple[str, Any]]:
    """Signed bounces and complaints from each provider about users 1 to 6; the requests sent."""
    sent: list[tuple[str, Any]] = [
        ("ses", sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "user1@example.test", user_id=1))),
        (
            "ses",
            sns.message(ses.NOTIFICATION, message=ses_notification("Complaint", "USER2@example.test"), version="2"),
        ),
        (
            "sendgrid",
            [
                sendgrid_event("bounce", "user3@example.test", type="bounce", status="5.1.1"),
                sendgrid_event("spamreport", "user4@example.test"),
                # Deliveries and opens are acknowledged and left out.
                sendgrid_event("delivered", "user7@example.test"),
            ],
        ),
        ("postmark", postmark_complaint("user5@example.test")),
        (
            "mailgun",
            mailgun_post(
                mailgun_event("failed", "user6@example.test", severity="permanent"), timestamp=int(time.time())
            ),
        ),
    ]
    for provider, request in sent:
        status = {
            "ses": lambda r: post_ses(web, r),
            "sendgrid": lambda r: post_sendgrid(web, r),
            "postmark": lambda r: post_postmark(web, r),
            "mailgun": lambda r: post(web, "/hooks/mailgun", r),
        }[provider](request)
        assert status == 200, (provider, status, web.log_path.read_text())
    return sent


EXPECTED = {
    1: ("bounced", "ses"),
    2: ("complained", "ses"),
    3: ("bounced", "sendgrid"),
    4: ("complained", "sendgrid"),
    5: ("complained", "postmark"),
    6: ("bounced", "mailgun"),
}


def test_signed_events_from_each_provider_suppress_exactly_their_users_and_retries_change_nothing(
    sessions, start_web, sns
):
    load_users(sessions, count=9, inactive_every=100)
    web = start_web()
    assert "Provider webhooks: /hooks/ses, /hooks/sendgrid, /hooks/postmark, /hooks/mailgun" in web.log_path.read_text()
    confirmation = sns.message(ses.SUBSCRIPTION_CONFIRMATION, message="You have chosen to subscribe to the topic.")
    assert post_ses(web, confirmation) == 200
    # The web process visited the SubscribeURL, which is what confirms the subscription.
    assert confirmation["SubscribeURL"].removeprefix(sns.base_url) in sns.requests

    sent = suppress_one_user_per_way(web, sns)
    assert suppressed(sessions) == EXPECTED
    assert stored_events(sessions) == 6

    # The same request again is a replay, refused: the same SNS notification, the same SendGrid
    # signature, Postmark events all taken before, Mailgun's token (406: Mailgun stops).
    (_, bounce), _, (_, sendgrid_batch), (_, complaint), (_, mailgun) = sent
    assert post_ses(web, bounce) == 409
    assert post_postmark(web, complaint) == 409
    assert post(web, "/hooks/mailgun", mailgun) == 406
    # A retry of SendGrid's or Mailgun's own is signed anew: taken, and its events change nothing.
    body = json.dumps(sendgrid_batch).encode()
    signed = sendgrid_headers(body, int(time.time()) + 1)  # signed a moment after the first
    assert post(web, "/hooks/sendgrid", body, **signed) == 200
    assert post(web, "/hooks/sendgrid", body, **signed) == 409
    resigned = mailgun_post(mailgun["event-data"], timestamp=int(time.time()))
    assert post(web, "/hooks/mailgun", resigned) == 200
    assert stored_events(sessions) == 6
    assert suppressed(sessions) == EXPECTED
    # The SNS certificate was fetched once and then served from the process's cache.
    assert sum(path.endswith(".pem") for path in sns.requests) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_subscription_confirmation_whose_visit_failed_is_visited_again_when_sns_retries(sessions, start_web, sns):
    web = start_web()
    confirmation = sns.message(ses.SUBSCRIPTION_CONFIRMATION, message="You have chosen to subscribe to the topic.")
    visit = confirmation["SubscribeURL"].removeprefix(sns.base_url)
    sns.failing_confirmations[0] = 1
    # SNS could not be reached to confirm: 503, so that SNS sends the confirmation again.
    assert post_ses(web, confirmation) == 503
    assert post_ses(web, confirmation) == 200
    assert sns.requests.count(visit) == 2


def test_a_replay_is_refused_for_each_provider_however_long_another_providers_tokens_are_kept(sessions, start_web, sns):
    load_users(sessions, count=3, inactive_every=100)
    web = start_web()
    bounce = sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "user1@example.test", user_id=1))
    assert post_ses(web, bounce) == 200
    with sessions.begin() as session:
        # Eleven minutes on: SNS's own are still fresh for an hour; SendGrid's and Mailgun's are not.
        session.execute(update(WebhookToken).values(seen_at=utcnow() - timedelta(minutes=11)))
    assert post_sendgrid(web, [sendgrid_event("spamreport", "user2@example.test")]) == 200
    assert post_ses(web, bounce) == 409
    # What SendGrid signs, not its signature's encoding, makes a request one of a kind.
    body = json.dumps([sendgrid_event("spamreport", "user3@example.test")]).encode()
    signed = sendgrid_headers(body, int(time.time()))
    assert post(web, "/hooks/sendgrid", body, **signed) == 200
    assert post(web, "/hooks/sendgrid", body, **{**signed, SIGNATURE: other_form(signed[SIGNATURE])}) == 409


def test_forged_stale_replayed_or_malformed_requests_are_refused_and_change_nothing(sessions, start_web, sns, tmp_path):
    load_users(sessions, count=3, inactive_every=100)
    web = start_web()
    now = int(time.time())
    bounce = ses_notification("Bounce", "user1@example.test")
    (tmp_path / "other").mkdir()
    other = Pki(tmp_path / "other")
    sendgrid_body = json.dumps([sendgrid_event("spamreport", "user1@example.test")]).encode()
    good_mailgun = mailgun_post(mailgun_event("complained", "user2@example.test"), timestamp=now)
    cases: list[tuple[str, int, Any, dict[str, str]]] = [
        ("/hooks/ses", 401, sns.message(ses.NOTIFICATION, message=bounce, key=other.signing_key), {}),
        ("/hooks/ses", 403, sns.message(ses.NOTIFICATION, message=bounce, topic_arn=TOPIC_ARN + "-other"), {}),
        ("/hooks/ses", 401, sns.message(ses.NOTIFICATION, message=bounce, timestamp=_hours_ago(3)), {}),
        (
            "/hooks/ses",
            401,
            sns.message(
                ses.NOTIFICATION, message=bounce, cert_url="https://sns.us-east-1.amazonaws.com.evil.test/c.pem"
            ),
            {},
        ),
        ("/hooks/ses", 401, sns.message(ses.NOTIFICATION, message=bounce, cert_url="http://127.0.0.1:1/c.pem"), {}),
        ("/hooks/ses", 400, b"{not json", {}),
        ("/hooks/sendgrid", 401, sendgrid_body, {}),
        ("/hooks/sendgrid", 401, sendgrid_body + b" ", sendgrid_headers(sendgrid_body, now)),
        ("/hooks/sendgrid", 401, sendgrid_body, sendgrid_headers(sendgrid_body, now - 3600)),
        ("/hooks/sendgrid", 400, b"[{", sendgrid_headers(b"[{", now)),
        ("/hooks/postmark", 401, postmark_bounce("user1@example.test"), {}),
        (
            "/hooks/postmark",
            401,
            postmark_bounce("user1@example.test"),
            {"Authorization": postmark_authorization(password="not-the-password-0000")},
        ),
        ("/hooks/postmark", 400, b"not json", {"Authorization": postmark_authorization()}),
        ("/hooks/mailgun", 401, mailgun_post(good_mailgun["event-data"], timestamp=now, key="x" * 32), {}),
        ("/hooks/mailgun", 401, mailgun_post(good_mailgun["event-data"], timestamp=now - 301), {}),
        ("/hooks/mailgun", 400, b"]", {}),
        # Arrays nested deeper than the JSON parser recurses, a Type that is no name, and timestamps
        # that are digits to str.isdigit but not to int: refused, not a server error.
        ("/hooks/mailgun", 400, b"[" * 5000, {}),
        ("/hooks/ses", 400, b"[" * 5000, {}),
        ("/hooks/ses", 400, b'{"Type": []}', {}),
        ("/hooks/sendgrid", 401, sendgrid_body, {**sendgrid_headers(sendgrid_body, now), TIMESTAMP: "\u00b2"}),
        ("/hooks/sendgrid", 401, sendgrid_body, {**sendgrid_headers(sendgrid_body, now), TIMESTAMP: "9" * 5000}),
        ("/hooks/other", 404, b"{}", {}),
    ]
    for path, status, body, headers in cases:
        assert post(web, path, body, **headers) == status, (path, status, body if isinstance(body, dict) else "")
    assert post_oversized(web, "/hooks/sendgrid", chunked=False) == 413
    assert post_oversized(web, "/hooks/mailgun", chunked=True) == 413
    assert suppressed(sessions) == {}
    assert stored_events(sessions) == 0
    log = web.log_path.read_text()
    # One line per refusal (the unknown path is Starlette's plain 404), echoing nothing of the body.
    assert log.count("Refused a ") == len(cases) - 1 + 2
    assert "user1@example.test" not in log and "not json" not in log and POSTMARK_AUTH[1] not in log
    # No slash redirect: its Location would be built from the request's own scheme and Host.
    assert (
        post(web, "/hooks/postmark/", postmark_bounce("user1@example.test"), Authorization=postmark_authorization())
        == 404
    )


def test_a_webhook_batch_far_larger_than_the_web_processs_own_body_cap_is_taken(sessions, start_web, sns):
    # The web process caps every body at a few KiB for its own pages; a provider posts far more.
    web = start_web()
    events = [sendgrid_event("bounce", f"nobody-{n}@example.test", type="bounce") for n in range(200)]
    assert len(json.dumps(events)) > 8 * 4096
    assert post_sendgrid(web, events) == 200
    assert stored_events(sessions) == len(events)


@pytest.mark.parametrize("providers", [("mailgun",)])
def test_a_provider_whose_setting_is_unset_answers_404_even_to_a_signed_request(sessions, start_web, sns):
    load_users(sessions, count=3, inactive_every=100)
    web = start_web()
    assert "Provider webhooks: /hooks/mailgun\n" in web.log_path.read_text()
    assert post_ses(web, sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "user1@example.test"))) == 404
    assert post_sendgrid(web, [sendgrid_event("bounce", "user1@example.test")]) == 404
    assert post_postmark(web, postmark_bounce("user1@example.test")) == 404
    assert suppressed(sessions) == {}
    complaint = mailgun_post(mailgun_event("complained", "user2@example.test"), timestamp=int(time.time()))
    assert post(web, "/hooks/mailgun", complaint) == 200
    assert suppressed(sessions) == {2: ("complained", "mailgun")}


def test_the_next_period_mails_everyone_but_the_users_the_webhooks_suppressed(
    settings, sessions, start_web, sns, smtp_server, start_workers
):
    population = load_users(sessions, count=12, inactive_every=100)
    suppress_one_user_per_way(start_web(), sns)
    mail_settings = replace(settings, smtp_url=smtp_server.url)
    start_workers(mail_settings, processes=1, threads=4)
    assert run_cli(mail_settings, "trigger", PERIOD).returncode == 0

    wait_for_progress(mail_settings, PERIOD, timeout=90)
    by_user = smtp_server.by_user()
    assert sorted(by_user) == sorted(set(population.active) - set(EXPECTED))
    assert all(len(messages) == 1 for messages in by_user.values()), by_user


def _hours_ago(hours: int):  # type: ignore[no-untyped-def]
    import datetime as dt

    return dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)
