"""Build the report email: multipart text and HTML, stable Message-ID, no header injection."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime

from reports.errors import InvalidRecipient
from reports.periods import Period
from reports.render import RenderedReport

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
#: ASCII only: an internationalized address needs SMTPUTF8 end to end, which is not assumed.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+"
_ADDRESS = re.compile(rf"{_ATOM}@(?:[A-Za-z0-9-]+\.)+[A-Za-z0-9-]+|{_ATOM}@localhost")


def message_id(period: Period, user_id: int, domain: str, *, request_id: str | None = None) -> str:
    """The same for every attempt and replay of one (period, user), so receivers can drop repeats.

    A ``send-now`` request that sends the report again gets its own, stable for that request:
    a resend is a new email, which a receiver must not drop as a repeat of the first.
    """
    suffix = f".{request_id}" if request_id else ""
    return f"<report.{period}.{user_id}{suffix}@{domain}>"


def display_name(name: str | None) -> str:
    """A user's name made safe for a header: control characters (CR, LF…) become one space."""
    return _CONTROL.sub(" ", name or "").strip()


def recipient(email: str, name: str | None) -> Address:
    if not isinstance(email, str) or not _ADDRESS.fullmatch(email.strip()):
        raise InvalidRecipient("The user's email address is not a valid address.")
    username, _, domain = email.strip().rpartition("@")
    try:
        return Address(display_name=display_name(name), username=username, domain=domain)
    except (ValueError, HeaderParseError):
        raise InvalidRecipient("The user's email address is not a valid address.") from None


def compose(
    rendered: RenderedReport,
    *,
    to: Address,
    mail_from: str,
    period: Period,
    user_id: int,
    date: datetime,
    message_id: str,
) -> EmailMessage:
    message = EmailMessage(policy=SMTP)
    message["From"] = mail_from
    message["To"] = to
    message["Subject"] = rendered.subject
    message["Date"] = format_datetime(date.replace(tzinfo=UTC))
    message["Message-ID"] = message_id
    message["X-Report-Period"] = str(period)
    message["X-Report-User-Id"] = str(user_id)
    message.set_content(rendered.text)
    message.add_alternative(rendered.html, subtype="html")
    return message
