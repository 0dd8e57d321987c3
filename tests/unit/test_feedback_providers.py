"""SendGrid, Postmark and Mailgun webhooks verified as each provider documents it, and their events read."""

from __future__ import annotations

import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from reports.clock import utcnow
from reports.delivery.mail.compose import message_id
from reports.feedback import events, mailgun, postmark, sendgrid
from reports.feedback.events import Kind, Rejected
from reports.periods import Period
from tests.support.feedback import (
    MAILGUN_KEY,
    POSTMARK_AUTH,
    SENDGRID_KEY,
    mailgun_event,
    mailgun_post,
    postmark_authorization,
    postmark_bounce,
    postmark_complaint,
    sendgrid_event,
    sendgrid_headers,
)


def refusal(call) -> Rejected:  # type: ignore[no-untyped-def]
    with pytest.raises(Rejected) as caught:
        call()
    return caught.value


# --- SendGrid ----------------------------------------------------------------------------------

PUBLIC = SENDGRID_KEY.public_key()


def sendgrid_verify(body: bytes, headers: dict[str, str], now: float | None = None) -> None:
    sendgrid.verify(
        PUBLIC,
        body,
        headers.get(sendgrid.SIGNATURE_HEADER),
        headers.get(sendgrid.TIMESTAMP_HEADER),
        time.time() if now is None else now,
    )


def test_a_signed_sendgrid_post_verifies():
    body = json.dumps([sendgrid_event("bounce", "a@example.test")]).encode()
    sendgrid_verify(body, sendgrid_headers(body, int(time.time())))


def test_a_sendgrid_post_with_its_body_changed_or_signed_by_another_key_fails():
    body = json.dumps([sendgrid_event("spamreport", "a@example.test")]).encode()
    headers = sendgrid_headers(body, int(time.time()))
    assert refusal(lambda: sendgrid_verify(body + b" ", headers)).status == 401
    forged = sendgrid_headers(body, int(time.time()), key=ec.generate_private_key(ec.SECP256R1()))
    assert refusal(lambda: sendgrid_verify(body, forged)).status == 401
    # The timestamp is signed too: a fresh one on an old signature does not verify.
    # Moved from the signed one, not from the clock: a second that ticks over meanwhile would
    # make the clock's moment minus one the signed moment itself.
    moved = {**headers, sendgrid.TIMESTAMP_HEADER: str(int(headers[sendgrid.TIMESTAMP_HEADER]) - 1)}
    assert refusal(lambda: sendgrid_verify(body, moved)).status == 401


@pytest.mark.parametrize("drop", [sendgrid.SIGNATURE_HEADER, sendgrid.TIMESTAMP_HEADER])
def test_a_sendgrid_post_without_either_header_fails(drop):
    body = b"[]"
    headers = sendgrid_headers(body, int(time.time()))
    del headers[drop]
    assert "missing" in refusal(lambda: sendgrid_verify(body, headers)).reason


@pytest.mark.parametrize("age", [sendgrid.TOLERANCE_SECONDS + 5, -(sendgrid.TOLERANCE_SECONDS + 5)])
def test_a_stale_or_future_sendgrid_timestamp_fails_even_when_signed(age):
    body = b"[]"
    headers = sendgrid_headers(body, int(time.time()) - age)
    assert "stale" in refusal(lambda: sendgrid_verify(body, headers)).reason


def test_sendgrid_events_that_concern_the_address_are_read_and_others_left_out():
    posted = [
        sendgrid_event("bounce", "hard@example.test", status="5.1.1", type="bounce"),
        sendgrid_event("bounce", "block@example.test", type="blocked"),
        sendgrid_event("blocked", "old-block@example.test"),
        sendgrid_event("dropped", "dropped@example.test", reason="Bounced Address"),
        sendgrid_event("dropped", "content@example.test", reason="Spam Content"),
        sendgrid_event("spamreport", "spam@example.test", **{"smtp-id": "<report.2026-10.9@reports.test>"}),
        sendgrid_event("unsubscribe", "unsub@example.test"),
        sendgrid_event("delivered", "ok@example.test"),
        sendgrid_event("open", "ok@example.test"),
    ]
    found = sendgrid.feedback(json.dumps(posted).encode(), utcnow())
    assert [(e.address, e.kind) for e in found] == [
        ("hard@example.test", Kind.HARD_BOUNCE),
        ("block@example.test", Kind.SOFT_BOUNCE),
        ("old-block@example.test", Kind.SOFT_BOUNCE),
        ("dropped@example.test", Kind.HARD_BOUNCE),
        ("spam@example.test", Kind.COMPLAINT),
        ("unsub@example.test", Kind.UNSUBSCRIBE),
    ]
    assert [e.event_id for e in found] == [p["sg_event_id"] for p in posted[:4] + posted[5:7]]
    assert (found[4].user_id, found[4].period) == (9, "2026-10")
    assert found[0].summary == "bounce bounce 5.1.1"


@pytest.mark.parametrize(
    "body", [b"{", b'{"event": "bounce"}', b"[1]", b'[{"event": "bounce", "email": "a@example.test"}]']
)
def test_a_sendgrid_body_that_is_no_event_array_is_a_400(body):
    assert refusal(lambda: sendgrid.feedback(body, utcnow())).status == 400


# --- Postmark ----------------------------------------------------------------------------------


def test_postmark_basic_credentials_must_be_exactly_the_configured_ones():
    postmark.verify(*POSTMARK_AUTH, postmark_authorization())
    for header in (
        None,
        "",
        postmark_authorization(password="wrong-password-0123456789"),
        postmark_authorization(user="other"),
        postmark_authorization().replace("Basic", "Bearer"),
        "Basic not-base64!",
    ):
        assert refusal(lambda h=header: postmark.verify(*POSTMARK_AUTH, h)).status == 401


def test_postmark_bounces_and_complaints_are_read_and_other_records_left_out():
    def read(record: dict[str, object]) -> list[tuple[str, Kind]]:
        return [(e.address, e.kind) for e in postmark.feedback(json.dumps(record).encode(), utcnow())]

    assert read(postmark_bounce("a@example.test")) == [("a@example.test", Kind.HARD_BOUNCE)]
    assert read(postmark_bounce("b@example.test", "SoftBounce")) == [("b@example.test", Kind.SOFT_BOUNCE)]
    assert read(postmark_complaint("c@example.test")) == [("c@example.test", Kind.COMPLAINT)]
    assert read(postmark_bounce("d@example.test", "AutoResponder")) == []
    assert read({"RecordType": "Delivery", "Email": "e@example.test"}) == []


def test_a_postmark_record_with_report_metadata_names_its_user():
    record = postmark_bounce("a@example.test", Metadata={"X-Report-User-Id": "12", "X-Report-Period": "2026-09"})
    [event] = postmark.feedback(json.dumps(record).encode(), utcnow())
    assert (event.user_id, event.period, event.event_id) == (12, "2026-09", str(record["ID"]))


@pytest.mark.parametrize("body", [b"nope", b"[]", json.dumps(postmark_bounce("no-at-sign")).encode()])
def test_a_postmark_body_that_is_no_record_is_a_400(body):
    assert refusal(lambda: postmark.feedback(body, utcnow())).status == 400


# --- Mailgun -----------------------------------------------------------------------------------


def test_a_signed_fresh_mailgun_post_verifies_and_gives_its_token():
    now = int(time.time())
    posted = mailgun_post(mailgun_event("failed", "a@example.test", severity="permanent"), timestamp=now)
    post = mailgun.verify(MAILGUN_KEY, posted, now)
    assert post.token == posted["signature"]["token"]


def test_a_mailgun_post_with_a_wrong_or_missing_signature_fails():
    now = int(time.time())
    event = mailgun_event("complained", "a@example.test")
    forged = mailgun_post(event, timestamp=now, key="another-signing-key-0123456789")
    assert "does not verify" in refusal(lambda: mailgun.verify(MAILGUN_KEY, forged, now)).reason
    swapped = mailgun_post(event, timestamp=now)
    swapped["signature"]["token"] = "f" * 50
    assert refusal(lambda: mailgun.verify(MAILGUN_KEY, swapped, now)).status == 401
    assert refusal(lambda: mailgun.verify(MAILGUN_KEY, {"event-data": event}, now)).status == 401


@pytest.mark.parametrize("age", [mailgun.TOLERANCE_SECONDS + 1, -(mailgun.TOLERANCE_SECONDS + 1)])
def test_a_mailgun_signature_older_than_five_minutes_or_from_the_future_fails(age):
    now = int(time.time())
    posted = mailgun_post(mailgun_event("complained", "a@example.test"), timestamp=now - age)
    assert "5 minutes" in refusal(lambda: mailgun.verify(MAILGUN_KEY, posted, now)).reason


def test_mailgun_failures_by_severity_and_complaints_are_read():
    now = int(time.time())

    def read(event: dict[str, object]) -> list[tuple[Kind, int | None]]:
        post = mailgun.verify(MAILGUN_KEY, mailgun_post(event, timestamp=now), now)
        return [(e.kind, e.user_id) for e in mailgun.feedback(post, utcnow())]

    ours = message_id(Period.parse("2026-10"), 5, "reports.test").strip("<>")
    assert read(mailgun_event("failed", "a@example.test", severity="permanent", message_id=ours)) == [
        (Kind.HARD_BOUNCE, 5)
    ]
    assert read(mailgun_event("failed", "a@example.test", severity="temporary")) == [(Kind.SOFT_BOUNCE, None)]
    assert read(mailgun_event("complained", "a@example.test")) == [(Kind.COMPLAINT, None)]
    assert read(mailgun_event("delivered", "a@example.test")) == []


# --- What the emails' headers say --------------------------------------------------------------


def test_every_message_id_the_mailer_mints_is_read_back_as_its_user_and_period():
    for period, user_id, request_id in [
        ("2026-10", 1, None),
        ("2025-01", 4_294_967, "0f3c-aa"),
        ("2026-12", 9, None),
        ("2026-10", 0, None),
        ("2026-10", -5, "0f3c-aa"),
    ]:
        minted = message_id(Period.parse(period), user_id, "reports.test", request_id=request_id)
        assert events.from_message_id(minted) == events.Reference(user_id, period)


@pytest.mark.parametrize("value", ["<other.2026-10.5@x>", "<report.2026-13.5@x>", "<report.2026-10.05@x>", "", None])
def test_message_ids_of_other_mail_name_nobody(value):
    assert events.from_message_id(value) == events.Reference()


def test_the_headers_win_over_the_message_id():
    headers = {"x-report-user-id": "3", "x-report-period": "2026-08", "message-id": "<report.2026-10.5@x>"}
    assert events.reference(headers.get) == events.Reference(3, "2026-08")
    assert events.reference({"x-report-user-id": "nope", "message-id": "<report.2026-10.5@x>"}.get) == (
        events.Reference(5, "2026-10")
    )
