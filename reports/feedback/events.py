"""What every provider's webhook is turned into: one :class:`Event` per recipient, and the refusal
of a request that does not verify."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from reports.errors import ReportsError
from reports.jobs import USER_ID_PATTERN

_T = TypeVar("_T", dict, list)  # type: ignore[type-arg]

#: Longest provider event id kept, in characters.
MAX_EVENT_ID = 200
#: Longest address kept (RFC 5321's path limit), in characters.
MAX_ADDRESS = 320
#: Longest summary kept, in characters.
MAX_SUMMARY = 200

_WHOLE_NUMBER = re.compile("[0-9]{1,18}")


class Provider(enum.StrEnum):
    SES = "ses"
    SENDGRID = "sendgrid"
    POSTMARK = "postmark"
    MAILGUN = "mailgun"


class Kind(enum.StrEnum):
    #: The address does not exist, or the provider will not deliver to it again.
    HARD_BOUNCE = "hard_bounce"
    #: A delivery that failed for now (mailbox full, greylisting); enough of them suppress.
    SOFT_BOUNCE = "soft_bounce"
    #: The person marked the email as spam.
    COMPLAINT = "complaint"
    #: The person unsubscribed through the provider (its own link or list).
    UNSUBSCRIBE = "unsubscribe"


class Rejected(ReportsError):
    """The webhook request was refused; nothing was stored."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        #: The HTTP status the provider gets.
        self.status = status
        #: Why, in a few words for the log (never the body or a secret).
        self.reason = reason


def unauthorized(reason: str) -> Rejected:
    return Rejected(401, reason)


def malformed(reason: str) -> Rejected:
    return Rejected(400, reason)


@dataclass(frozen=True)
class Event:
    """One provider event about one recipient of one email."""

    provider: Provider
    #: The provider's id of the event (per recipient when one event names several).
    event_id: str
    kind: Kind
    #: The address the email went to, as the provider reports it.
    address: str
    #: When the provider saw it happen (naive UTC).
    occurred_at: datetime
    #: The provider's own classification ("Permanent/General", "HardBounce", "550 5.1.1"), no personal data.
    summary: str
    #: From the email's ``X-Report-User-Id`` or Message-ID, when the provider echoes them.
    user_id: int | None = None
    #: From the email's ``X-Report-Period`` or Message-ID.
    period: str | None = None


@dataclass(frozen=True)
class Reference:
    """The user and period an email was for, read from what the provider echoes of its headers."""

    user_id: int | None = None
    period: str | None = None


#: The Message-ID :func:`reports.delivery.mail.compose.message_id` mints: ``<report.PERIOD.USER[.REQUEST]@domain>``.
_MESSAGE_ID = re.compile(rf"<?report\.(\d{{4}}-(?:0[1-9]|1[0-2]))\.({USER_ID_PATTERN})(?:\.[0-9A-Za-z-]+)?@[^>\s]+>?")
_PERIOD = re.compile(r"\d{4}-(?:0[1-9]|1[0-2])")
_USER_ID = re.compile(USER_ID_PATTERN)


def reference(header: Callable[[str], str | None]) -> Reference:
    """The user and period from ``X-Report-User-Id`` and ``X-Report-Period``, else from the Message-ID.

    :param header: the value of a header by its lower-case name, or ``None``.
    """
    user, period = (header("x-report-user-id") or "").strip(), (header("x-report-period") or "").strip()
    if _USER_ID.fullmatch(user):
        return Reference(int(user), period if _PERIOD.fullmatch(period) else None)
    return from_message_id(header("message-id"))


def from_message_id(message_id: str | None) -> Reference:
    match = _MESSAGE_ID.fullmatch((message_id or "").strip())
    return Reference(int(match[2]), match[1]) if match else Reference()


def event(
    provider: Provider,
    event_id: object,
    kind: Kind,
    address: object,
    occurred_at: datetime,
    summary: str,
    ref: Reference = Reference(),  # noqa: B008 - a frozen, empty value
) -> Event:
    """An :class:`Event` with its fields checked and cut to what the table keeps."""
    if not isinstance(event_id, str | int) or not str(event_id).strip():
        raise malformed("an event has no id")
    if not isinstance(address, str) or "@" not in address or len(address) > MAX_ADDRESS:
        raise malformed("an event has no valid recipient address")
    return Event(
        provider=provider,
        event_id=str(event_id).strip()[:MAX_EVENT_ID],
        kind=kind,
        address=address.strip(),
        occurred_at=occurred_at,
        summary=" ".join(summary.split())[:MAX_SUMMARY],
        user_id=ref.user_id,
        period=ref.period,
    )


def json_body(body: bytes, expected: type[_T], what: str) -> _T:
    """``body`` parsed as JSON of the ``expected`` type; :class:`Rejected` (400) otherwise."""
    try:
        value = json.loads(body)
    # RecursionError: arrays nested a few thousand deep, which the parser reads by recursing.
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise malformed("the body is not JSON") from None
    if not isinstance(value, expected):
        raise malformed(f"the body is not {what}")
    return value


def from_unix(value: object, *, default: datetime) -> datetime:
    """A provider's Unix time (seconds, maybe fractional) as naive UTC; ``default`` when unreadable."""
    try:
        return datetime.fromtimestamp(float(value), UTC).replace(tzinfo=None)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError, OSError):
        return default


def from_iso(value: object, *, default: datetime) -> datetime:
    """A provider's ISO 8601 time as naive UTC; ``default`` when unreadable."""
    if not isinstance(value, str):
        return default
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        # OverflowError: a time at the calendar's very start or end, moved to UTC.
        return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo else parsed
    except (ValueError, OverflowError):
        return default


def whole_number(text: str) -> int | None:
    """``text`` (a Unix time or a length in a header) as a whole number; ``None`` unless it is ASCII
    digits, and few enough that ``int`` reads them (``str.isdigit`` also takes "²", which ``int`` refuses)."""
    return int(text) if _WHOLE_NUMBER.fullmatch(text) else None
