"""SendGrid's Event Webhook: the signature checked as SendGrid documents it ("Event Webhook
security features": ECDSA P-256 with SHA-256 over the timestamp header followed by the raw body),
and its bounce, block, drop, spam report and unsubscribe events read."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from reports.feedback import events
from reports.feedback.events import Event, Kind, Provider, malformed, unauthorized

SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"

#: How far the signed timestamp may be from now, either way, in seconds. SendGrid signs each post
#: when it makes it, retries included; SendGrid documents no tolerance, so this is Mailgun's.
TOLERANCE_SECONDS = 300

#: Why SendGrid dropped a message, for the reasons that are about the address.
_DROPPED = {
    "Bounced Address": Kind.HARD_BOUNCE,
    "Invalid": Kind.HARD_BOUNCE,
    "Spam Reporting Address": Kind.COMPLAINT,
    "Unsubscribed Address": Kind.UNSUBSCRIBE,
}


def verify(
    key: ec.EllipticCurvePublicKey, body: bytes, signature: str | None, timestamp: str | None, now: float
) -> None:
    """Refuse the request unless ``signature`` signs ``timestamp + body`` with ``key`` and is fresh.

    :param now: Unix time, in seconds.
    """
    if not signature or not timestamp:
        raise unauthorized("the SendGrid signature or timestamp header is missing")
    seconds = events.whole_number(timestamp)
    if seconds is None or abs(now - seconds) > TOLERANCE_SECONDS:
        raise unauthorized("the SendGrid timestamp is stale or unreadable")
    try:
        key.verify(base64.b64decode(signature, validate=True), timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, binascii.Error, ValueError):
        raise unauthorized("the SendGrid signature does not verify") from None


def feedback(body: bytes, now: datetime) -> list[Event]:
    """The events of a verified post that say something about an address; others are left out."""
    posted = events.json_body(body, list, "a JSON array of SendGrid events")
    if not all(isinstance(item, dict) for item in posted):
        raise malformed("the body is not a JSON array of SendGrid events")
    found = []
    for item in posted:
        kind = _kind(item)
        if kind is not None:
            found.append(
                events.event(
                    Provider.SENDGRID,
                    item.get("sg_event_id"),
                    kind,
                    item.get("email"),
                    events.from_unix(item.get("timestamp"), default=now),
                    _summary(item),
                    # SendGrid echoes no header; its smtp-id is the Message-ID the email was sent with.
                    events.from_message_id(str(item.get("smtp-id") or "")),
                )
            )
    return found


def _kind(item: dict[str, Any]) -> Kind | None:
    name = item.get("event")
    if name == "bounce":
        # Newer accounts post a block as a bounce of type "blocked".
        return Kind.SOFT_BOUNCE if item.get("type") == "blocked" else Kind.HARD_BOUNCE
    if name == "blocked":
        return Kind.SOFT_BOUNCE
    if name == "dropped":
        return _DROPPED.get(str(item.get("reason", "")))
    if name == "spamreport":
        return Kind.COMPLAINT
    if name in ("unsubscribe", "group_unsubscribe"):
        return Kind.UNSUBSCRIBE
    return None


def _summary(item: dict[str, Any]) -> str:
    # The status code and the classification, not the reason text: that quotes the remote server,
    # which may name the mailbox.
    parts = [item.get("event"), item.get("type"), item.get("status"), item.get("bounce_classification")]
    if item.get("event") == "dropped":
        parts.append(item.get("reason"))
    return " ".join(str(part) for part in parts if part)
