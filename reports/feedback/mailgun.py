"""Mailgun's webhooks: the signature checked as Mailgun documents it ("Securing webhooks": the hex
HMAC-SHA256 of timestamp + token with the webhook signing key), and its failed and complained
events read. Refusing a replayed token needs the database: :func:`reports.feedback.store.remember_token`."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reports.feedback import events
from reports.feedback.events import Event, Kind, Provider, malformed, unauthorized

#: How old a signature may be, and how far in the future, in seconds.
TOLERANCE_SECONDS = 300


@dataclass(frozen=True)
class Post:
    """A Mailgun post: its signature's token (one use only) and its event data."""

    token: str
    event_data: dict[str, Any]


def parse(body: bytes) -> dict[str, Any]:
    """The post's JSON object; :class:`Rejected` (400) when it is not one."""
    posted: dict[str, Any] = events.json_body(body, dict, "a Mailgun webhook post")
    return posted


def verify(key: str, posted: dict[str, Any], now: float) -> Post:
    """The signed post, or :class:`Rejected` when its signature is missing, wrong or stale.

    :param now: Unix time, in seconds.
    """
    signature = posted.get("signature")
    if not isinstance(signature, dict):
        raise unauthorized("the Mailgun signature is missing")
    timestamp, token, given = (str(signature.get(name, "")) for name in ("timestamp", "token", "signature"))
    if not timestamp or not token or not given:
        raise unauthorized("the Mailgun signature is incomplete")
    expected = hmac.new(key.encode(), (timestamp + token).encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.lower().encode()):
        raise unauthorized("the Mailgun signature does not verify")
    seconds = events.whole_number(timestamp)
    if seconds is None or abs(now - seconds) > TOLERANCE_SECONDS:
        raise unauthorized("the Mailgun timestamp is older than 5 minutes, or in the future")
    data = posted.get("event-data")
    if not isinstance(data, dict):
        raise malformed("the Mailgun post has no event-data")
    return Post(token=token, event_data=data)


def feedback(post: Post, now: datetime) -> list[Event]:
    """The post's event, if it is a failure or a complaint; none for other events."""
    data = post.event_data
    kind = _kind(data)
    if kind is None:
        return []
    message = data.get("message")
    headers = message.get("headers") if isinstance(message, dict) else None
    status = data.get("delivery-status")
    code = status.get("code") if isinstance(status, dict) else None
    return [
        events.event(
            Provider.MAILGUN,
            data.get("id"),
            kind,
            data.get("recipient"),
            events.from_unix(data.get("timestamp"), default=now),
            " ".join(str(part) for part in (data.get("event"), data.get("severity"), data.get("reason"), code) if part),
            events.from_message_id(str(headers.get("message-id") or ""))
            if isinstance(headers, dict)
            else events.Reference(),
        )
    ]


def _kind(data: dict[str, Any]) -> Kind | None:
    name = data.get("event")
    if name == "failed":
        return Kind.HARD_BOUNCE if data.get("severity") == "permanent" else Kind.SOFT_BOUNCE
    if name == "complained":
        return Kind.COMPLAINT
    if name == "unsubscribed":
        return Kind.UNSUBSCRIBE
    return None
