"""Postmark's bounce and spam complaint webhooks: HTTP basic credentials compared in constant time
(Postmark signs nothing; the webhook's basic auth is how it proves itself), and its records read."""

from __future__ import annotations

import base64
import binascii
import hmac
from datetime import datetime
from typing import Any

from reports.feedback import events
from reports.feedback.events import Event, Kind, Provider, unauthorized

#: Bounce types that say the address will not take mail again.
HARD_TYPES = frozenset({"HardBounce", "BadEmailAddress", "ManuallyDeactivated"})
#: Bounce types that failed this time: mailbox full, DNS trouble, a block, a spam filter's notice.
SOFT_TYPES = frozenset({"SoftBounce", "Transient", "DnsError", "Blocked", "SpamNotification", "Undeliverable"})


def verify(user: str, password: str, authorization: str | None) -> None:
    """Refuse the request unless its ``Authorization`` header is Basic with exactly these credentials."""
    scheme, _, encoded = (authorization or "").partition(" ")
    try:
        given = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        given = b""
    expected = f"{user}:{password}".encode()
    # Compared whole, in constant time, and only after decoding: nothing to learn from timing.
    if not (hmac.compare_digest(given, expected) and scheme.lower() == "basic"):
        raise unauthorized("the Postmark basic credentials are missing or wrong")


def feedback(body: bytes, now: datetime) -> list[Event]:
    """The record's event, if it is a bounce or complaint that says something about the address."""
    record = events.json_body(body, dict, "a Postmark record")
    kind = _kind(record)
    if kind is None:
        return []
    metadata = record.get("Metadata")
    headers = {str(k).lower(): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
    return [
        events.event(
            Provider.POSTMARK,
            record.get("ID"),
            kind,
            record.get("Email"),
            events.from_iso(record.get("BouncedAt"), default=now),
            f"{record.get('Type', '')} {record.get('TypeCode', '')}",
            # Postmark's MessageID is its own; metadata set when sending may carry the report's ids.
            events.reference(headers.get),
        )
    ]


def _kind(record: dict[str, Any]) -> Kind | None:
    bounce_type = str(record.get("Type", ""))
    if record.get("RecordType") == "SpamComplaint" or bounce_type == "SpamComplaint":
        return Kind.COMPLAINT
    if record.get("RecordType") != "Bounce":
        return None
    if bounce_type in HARD_TYPES:
        return Kind.HARD_BOUNCE
    if bounce_type in SOFT_TYPES:
        return Kind.SOFT_BOUNCE
    if bounce_type == "Unsubscribe":
        return Kind.UNSUBSCRIBE
    return None
