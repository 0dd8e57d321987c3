"""Amazon SES feedback through Amazon SNS: the SNS message verified as AWS documents it
("Verifying the signatures of Amazon SNS messages"), and SES's bounce and complaint notifications
(the SNS notification form, ``notificationType``, and the event-publishing form, ``eventType``) read.

Pure functions over the message; fetching the signing certificate is :mod:`reports.feedback.fetch`'s.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from reports.feedback import events
from reports.feedback.events import Event, Kind, Provider, Rejected, malformed, unauthorized

NOTIFICATION = "Notification"
SUBSCRIPTION_CONFIRMATION = "SubscriptionConfirmation"
UNSUBSCRIBE_CONFIRMATION = "UnsubscribeConfirmation"

#: The fields signed, in the order they are signed, per message type (a missing ``Subject`` is left out).
SIGNED_FIELDS = {
    NOTIFICATION: ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    SUBSCRIPTION_CONFIRMATION: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    UNSUBSCRIBE_CONFIRMATION: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}

#: SignatureVersion 1 is SHA1withRSA, 2 is SHA256withRSA.
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}

#: Where SNS serves its signing certificates and confirms subscriptions: its regional endpoints.
SNS_HOST = re.compile(r"sns\.[a-z0-9-]{3,}\.amazonaws\.com(?:\.cn)?")

#: How old a message may be: SNS retries an HTTPS delivery, with the same timestamp and signature,
#: for at most an hour; a few minutes more for clocks that disagree.
MAX_AGE = timedelta(hours=1, minutes=5)
#: How far in the future a message's timestamp may be (clock skew).
MAX_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class Message:
    """An SNS message: its type, topic, the fields it signs, and its signature."""

    type: str
    topic_arn: str
    fields: Mapping[str, str]
    signature: bytes
    signature_version: str
    signing_cert_url: str

    @property
    def subscribe_url(self) -> str:
        return self.fields.get("SubscribeURL", "")


def parse(body: bytes, *, message_type_header: str | None) -> Message:
    """The SNS message in ``body``; :class:`Rejected` (400) when it is not one."""
    data = events.json_body(body, dict, "an SNS message")
    kind = data.get("Type")
    if (
        not isinstance(kind, str)
        or kind not in SIGNED_FIELDS
        or (message_type_header is not None and message_type_header != kind)
    ):
        raise malformed("the body is not an SNS message of a known type")
    signed = {name: data[name] for name in SIGNED_FIELDS[kind] if data.get(name) is not None}
    required = set(SIGNED_FIELDS[kind]) - {"Subject"}
    if not required <= set(signed) or not all(isinstance(value, str) for value in signed.values()):
        raise malformed("the SNS message lacks a signed field")
    try:
        signature = base64.b64decode(str(data.get("Signature", "")), validate=True)
    except (binascii.Error, ValueError):
        raise unauthorized("the SNS signature is not base64") from None
    return Message(
        type=kind,
        topic_arn=signed["TopicArn"],
        fields=signed,
        signature=signature,
        signature_version=str(data.get("SignatureVersion", "")),
        signing_cert_url=str(data.get("SigningCertURL", "")),
    )


def canonical(message: Message) -> bytes:
    """The string SNS signs: each signed field present, in order, as ``name\\nvalue\\n``."""
    return "".join(
        f"{name}\n{message.fields[name]}\n" for name in SIGNED_FIELDS[message.type] if name in message.fields
    ).encode()


def check_topic(message: Message, allowed: frozenset[str]) -> None:
    if message.topic_arn not in allowed:
        raise Rejected(403, "the SNS topic is not one SES_TOPIC_ARNS lists")


def check_sns_url(url: str, *, allow_loopback: bool = False) -> None:
    """Refuse a certificate or subscription URL that is not https on an SNS endpoint.

    :param allow_loopback: also accept ``https://127.0.0.1:…`` (the tests' own server; see SNS_TEST_CA_FILE).
    """
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname or "", parts.port
    except ValueError:
        raise unauthorized("the SNS URL is malformed") from None
    loopback = allow_loopback and host in ("127.0.0.1", "localhost")
    if parts.scheme != "https" or parts.username or not (SNS_HOST.fullmatch(host) or loopback):
        raise unauthorized("the SNS URL is not https on an sns.<region>.amazonaws.com host")
    if not loopback and parts.port not in (None, 443):
        raise unauthorized("the SNS URL is not on the https port")


def check_fresh(message: Message, now: datetime) -> None:
    sent = events.from_iso(message.fields["Timestamp"], default=datetime.min)
    if sent == datetime.min or not now - MAX_AGE <= sent <= now + MAX_SKEW:
        raise unauthorized("the SNS message is stale or its timestamp unreadable")


def verify(message: Message, certificate_pem: bytes, now: datetime) -> None:
    """Check ``message``'s signature with the certificate at its SigningCertURL; :class:`Rejected` if it fails."""
    algorithm = _HASHES.get(message.signature_version)
    if algorithm is None:
        raise unauthorized("the SNS SignatureVersion is neither 1 nor 2")
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError:
        raise unauthorized("the SNS signing certificate does not parse") from None
    if (
        not certificate.not_valid_before_utc.replace(tzinfo=None)
        <= now
        <= certificate.not_valid_after_utc.replace(tzinfo=None)
    ):
        raise unauthorized("the SNS signing certificate is not valid now")
    key = certificate.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise unauthorized("the SNS signing certificate has no RSA key")
    try:
        key.verify(message.signature, canonical(message), padding.PKCS1v15(), algorithm())
    except InvalidSignature:
        raise unauthorized("the SNS signature does not verify") from None


def feedback(message: Message, now: datetime) -> list[Event]:
    """The bounce and complaint events of a verified notification; none for other SES events."""
    try:
        data = json.loads(message.fields["Message"])
    except ValueError:
        raise malformed("the SNS notification's Message is not JSON") from None
    if not isinstance(data, dict):
        raise malformed("the SNS notification's Message is not an SES notification")
    kind = data.get("notificationType") or data.get("eventType")
    ref = _reference(_object(data.get("mail")))
    if kind == "Bounce":
        return _bounces(_object(data.get("bounce")), ref, message, now)
    if kind == "Complaint":
        return _complaints(_object(data.get("complaint")), ref, message, now)
    return []


def _bounces(bounce: dict[str, Any], ref: events.Reference, message: Message, now: datetime) -> list[Event]:
    bounce_type = str(bounce.get("bounceType", ""))
    kind = Kind.HARD_BOUNCE if bounce_type == "Permanent" else Kind.SOFT_BOUNCE
    summary = f"{bounce_type}/{bounce.get('bounceSubType', '')}"
    return _per_recipient(bounce, "bouncedRecipients", kind, summary, ref, message, now)


def _complaints(complaint: dict[str, Any], ref: events.Reference, message: Message, now: datetime) -> list[Event]:
    feedback_type = str(complaint.get("complaintFeedbackType", ""))
    # An ISP's "not-spam" report undoes a complaint rather than making one.
    if feedback_type == "not-spam":
        return []
    summary = f"complaint {feedback_type or complaint.get('complaintSubType') or ''}"
    return _per_recipient(complaint, "complainedRecipients", Kind.COMPLAINT, summary, ref, message, now)


def _per_recipient(
    report: dict[str, Any],
    recipients_field: str,
    kind: Kind,
    summary: str,
    ref: events.Reference,
    message: Message,
    now: datetime,
) -> list[Event]:
    recipients = report.get(recipients_field)
    if not isinstance(recipients, list) or not recipients:
        raise malformed(f"the SES notification lists no {recipients_field}")
    base = report.get("feedbackId") or message.fields["MessageId"]
    occurred = events.from_iso(report.get("timestamp"), default=now)
    found = []
    for i, recipient in enumerate(recipients):
        # One id per recipient: a notification about several recipients is several events.
        event_id = base if len(recipients) == 1 else f"{base}:{i}"
        detail = _object(recipient)
        status = detail.get("status") or ""
        found.append(
            events.event(Provider.SES, event_id, kind, detail.get("emailAddress"), occurred, f"{summary} {status}", ref)
        )
    return found


def _reference(mail: dict[str, Any]) -> events.Reference:
    """The report's user and period from the original headers (SES includes them when the
    configuration set or identity says "include original headers"), else its Message-ID."""
    headers = {
        str(h.get("name", "")).lower(): str(h.get("value", ""))
        for h in mail.get("headers") or ()
        if isinstance(h, dict)
    }
    common = _object(mail.get("commonHeaders"))
    headers.setdefault("message-id", str(common.get("messageId") or ""))
    return events.reference(headers.get)


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
