"""Amazon SNS messages verified as AWS documents it, and SES's notifications read."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from reports.clock import utcnow
from reports.feedback import ses
from reports.feedback.events import Kind, Rejected
from tests.support.feedback import TOPIC_ARN, Pki, SnsServer, ses_notification

TOPICS = frozenset({TOPIC_ARN})


@pytest.fixture(scope="module")
def sns(tmp_path_factory: pytest.TempPathFactory) -> SnsServer:
    """Messages signed as SNS signs them (no server runs: the certificate is handed over directly)."""
    return SnsServer("https://sns.us-east-1.amazonaws.com", Pki(tmp_path_factory.mktemp("pki")))


def accepted(sns: SnsServer, data: dict[str, str], *, header: str | None = None) -> ses.Message:
    """``data`` parsed, its topic, freshness and signature checked as the endpoint checks them."""
    message = ses.parse(json.dumps(data).encode(), message_type_header=header)
    ses.check_topic(message, TOPICS)
    ses.check_fresh(message, utcnow())
    ses.verify(message, sns.pki.signing_pem, utcnow())
    return message


def refusal(call) -> Rejected:  # type: ignore[no-untyped-def]
    with pytest.raises(Rejected) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_signed_bounce_notification_verifies_and_names_the_user_its_headers_name(sns, version):
    data = sns.message(
        ses.NOTIFICATION,
        message=ses_notification("Bounce", "user7@example.test", user_id=7, period="2026-10"),
        version=version,
        subject="Amazon SES Email Event Notification",
    )
    message = accepted(sns, data, header="Notification")
    [event] = ses.feedback(message, utcnow())
    assert (event.kind, event.address, event.user_id, event.period) == (
        Kind.HARD_BOUNCE,
        "user7@example.test",
        7,
        "2026-10",
    )
    assert event.summary == "Permanent/General 5.1.1"


def test_a_subscription_confirmation_signs_its_subscribe_url_and_token(sns):
    data = sns.message(ses.SUBSCRIPTION_CONFIRMATION, message="You have chosen to subscribe…")
    assert accepted(sns, data).subscribe_url == data["SubscribeURL"]
    tampered = {**data, "SubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=other"}
    assert refusal(lambda: accepted(sns, tampered)).status == 401


@pytest.mark.parametrize("field", ["Message", "MessageId", "Timestamp", "Subject"])
def test_any_signed_field_changed_fails_the_signature(sns, field):
    data = sns.message(ses.NOTIFICATION, message=ses_notification("Complaint", "a@example.test"), subject="s")
    value = utcnow().isoformat() + "Z" if field == "Timestamp" else data[field] + "x"
    assert refusal(lambda: accepted(sns, {**data, field: value})).status == 401


@pytest.mark.parametrize("timestamp", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "yesterday"])
def test_a_timestamp_that_no_clock_can_read_in_utc_is_refused_as_unreadable(sns, timestamp):
    data = sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "a@example.test"))
    message = ses.parse(json.dumps({**data, "Timestamp": timestamp}).encode(), message_type_header=None)
    assert "unreadable" in refusal(lambda: ses.check_fresh(message, utcnow())).reason


def test_a_signature_by_another_key_fails(sns, tmp_path):
    other = Pki(tmp_path)
    data = sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "a@example.test"), key=other.signing_key)
    assert "does not verify" in refusal(lambda: accepted(sns, data)).reason


def test_an_unknown_signature_version_fails(sns):
    data = sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "a@example.test"), version="2")
    assert "SignatureVersion" in refusal(lambda: accepted(sns, {**data, "SignatureVersion": "3"})).reason


def test_a_topic_not_listed_is_refused_before_anything_is_fetched(sns):
    data = sns.message(
        ses.NOTIFICATION,
        message=ses_notification("Bounce", "a@example.test"),
        topic_arn="arn:aws:sns:us-east-1:999999999999:someone-else",
    )
    message = ses.parse(json.dumps(data).encode(), message_type_header=None)
    assert refusal(lambda: ses.check_topic(message, TOPICS)).status == 403


def test_a_message_older_than_sns_retries_is_refused(sns):
    old = dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)
    data = sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "a@example.test"), timestamp=old)
    assert "stale" in refusal(lambda: accepted(sns, data)).reason


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"Type": "Other"}', b'{"Type": "Notification", "Message": "x"}'],
)
def test_a_body_that_is_no_sns_message_is_a_400(body):
    assert refusal(lambda: ses.parse(body, message_type_header=None)).status == 400


def test_the_message_type_header_must_agree_with_the_body(sns):
    data = sns.message(ses.NOTIFICATION, message="{}")
    assert (
        refusal(lambda: ses.parse(json.dumps(data).encode(), message_type_header="SubscriptionConfirmation")).status
        == 400
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
        "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem",
        "https://sns.us-gov-west-1.amazonaws.com:443/x.pem",
    ],
)
def test_certificates_are_fetched_only_from_sns_endpoints(url):
    ses.check_sns_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",
        "https://evil.example/sns.us-east-1.amazonaws.com/x.pem",
        "https://s3.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com:8443/x.pem",
        "https://user@sns.us-east-1.amazonaws.com/x.pem",
        "https://127.0.0.1:8443/x.pem",
        "https://sns.us-east-1.amazonaws.com:bad/x.pem",
        "",
    ],
)
def test_any_other_certificate_url_is_refused(url):
    assert refusal(lambda: ses.check_sns_url(url)).status == 401


def test_loopback_is_allowed_only_in_the_tests_trust_mode():
    ses.check_sns_url("https://127.0.0.1:8443/x.pem", allow_loopback=True)
    assert refusal(lambda: ses.check_sns_url("http://127.0.0.1:8443/x.pem", allow_loopback=True)).status == 401


def _message(payload: dict[str, object]) -> ses.Message:
    return ses.Message(
        type=ses.NOTIFICATION,
        topic_arn=TOPIC_ARN,
        fields={"Message": json.dumps(payload), "MessageId": "sns-1"},
        signature=b"",
        signature_version="1",
        signing_cert_url="",
    )


def test_the_event_publishing_form_and_transient_bounces_are_read():
    payload = json.loads(ses_notification("Bounce", "b@example.test", bounce_type="Transient"))
    payload["eventType"] = payload.pop("notificationType")
    [event] = ses.feedback(_message(payload), utcnow())
    assert (event.kind, event.user_id) == (Kind.SOFT_BOUNCE, None)


def test_a_notification_about_several_recipients_is_one_event_each():
    payload = json.loads(ses_notification("Complaint", "a@example.test"))
    payload["complaint"]["complainedRecipients"].append({"emailAddress": "b@example.test"})
    found = ses.feedback(_message(payload), utcnow())
    assert [e.address for e in found] == ["a@example.test", "b@example.test"]
    assert len({e.event_id for e in found}) == 2


def test_a_not_spam_report_and_a_delivery_are_no_events():
    payload = json.loads(ses_notification("Complaint", "a@example.test"))
    payload["complaint"]["complaintFeedbackType"] = "not-spam"
    assert ses.feedback(_message(payload), utcnow()) == []
    assert ses.feedback(_message({"notificationType": "Delivery", "mail": {}}), utcnow()) == []


def test_the_report_is_found_by_its_message_id_when_the_headers_are_not_included():
    payload = json.loads(ses_notification("Bounce", "a@example.test"))
    payload["mail"]["commonHeaders"]["messageId"] = "<report.2026-10.42@reports.test>"
    [event] = ses.feedback(_message(payload), utcnow())
    assert (event.user_id, event.period) == (42, "2026-10")


def test_a_certificate_out_of_its_validity_fails(sns):
    data = sns.message(ses.NOTIFICATION, message=ses_notification("Bounce", "a@example.test"))
    message = ses.parse(json.dumps(data).encode(), message_type_header=None)
    later = utcnow() + dt.timedelta(days=30)
    assert "not valid now" in refusal(lambda: ses.verify(message, sns.pki.signing_pem, later)).reason
    assert "does not parse" in refusal(lambda: ses.verify(message, b"not a certificate", utcnow())).reason


def test_a_tests_trust_file_that_cannot_be_read_stops_start_up(tmp_path):
    from reports.errors import ConfigurationError
    from reports.feedback.fetch import SnsFetcher

    (tmp_path / "not-a-ca.pem").write_text("not a certificate")
    for path in (tmp_path / "missing.pem", tmp_path / "not-a-ca.pem"):
        with pytest.raises(ConfigurationError, match="SNS_TEST_CA_FILE"):
            SnsFetcher(ca_file=str(path))
