"""The console's query and form fields, checked: each function returns the value or raises
:class:`BadInput` with the line the page shows. Pure, like the commands' option checks."""

from __future__ import annotations

import re
import unicodedata

from reports.errors import BadInput
from reports.failures import dead_letters
from reports.jobs import MAX_USER_ID, MIN_USER_ID, USER_ID_PATTERN
from reports.models import DeadLetterReason, SuppressionReason
from reports.periods import Period

#: Longest text a search or filter field takes, in characters.
MAX_TEXT = 200

_USER_ID = re.compile(USER_ID_PATTERN)

#: ``dead_letters.id`` is a 32-bit integer.
MAX_DEAD_LETTER_ID = 2**31 - 1


def period(text: str | None) -> Period | None:
    return Period.parse(text.strip()) if text and text.strip() else None


def user_id(text: str | None) -> int:
    """Any 32-bit id: 0 and negative ids are users too."""
    value = (text or "").strip()
    if not _USER_ID.fullmatch(value) or not MIN_USER_ID <= int(value) <= MAX_USER_ID:
        raise BadInput(f"The user id must be a whole number from {MIN_USER_ID} to {MAX_USER_ID}.")
    return int(value)


def user_id_searched(text: str | None) -> int | None:
    """The user id a search names, ``None`` when it names none (an address, say)."""
    try:
        return user_id(text) if text else None
    except BadInput:
        return None


def user_cursor(text: str | None) -> int | None:
    """A keyset page's ``after`` user id; ``None`` for the first page, which starts below any id."""
    return user_id(text) if text else None


def dead_letter_id(text: str | None) -> int:
    return _whole(text, "dead letter id", MAX_DEAD_LETTER_ID)


def cursor(text: str | None) -> int | None:
    """A keyset page's ``before``/``after`` id; ``None`` for the first page."""
    return _whole(text, "page", MAX_DEAD_LETTER_ID) if text else None


def search_text(text: str | None) -> str | None:
    if not text or not text.strip():
        return None
    if len(text) > MAX_TEXT:
        raise BadInput(f"The search text is longer than {MAX_TEXT} characters.")
    # PostgreSQL refuses a NUL in text outright (the page was a 500), and no stored text holds one.
    if any(unicodedata.category(character) == "Cc" for character in text.strip()):
        raise BadInput("The search text holds a control character.")
    return text.strip()


def suppression_reason(text: str | None) -> SuppressionReason:
    try:
        return SuppressionReason(text or "")
    except ValueError:
        raise BadInput(f"Choose a reason: {', '.join(r.value for r in SuppressionReason)}.") from None


def dead_letter_filter(fields: dict[str, str]) -> dead_letters.Filter:
    """The dead-letter list's filter: period, reason (exactly), actor (exactly) and text (anywhere
    in the reason or the error), replayed ones shown only when asked."""
    cause = fields.get("reason") or None
    if cause is not None and cause not in {r.value for r in DeadLetterReason}:
        raise BadInput(f"Unknown reason {cause[:40]!r}.")
    found = period(fields.get("period"))
    return dead_letters.Filter(
        period=str(found) if found else None,
        cause=cause,
        actor=search_text(fields.get("actor")),
        reason=search_text(fields.get("text")),
        include_replayed=fields.get("replayed") == "1",
    )


def _whole(text: str | None, what: str, high: int) -> int:
    value = (text or "").strip()
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= high:
        raise BadInput(f"The {what} must be a whole number from 1 to {high}.")
    return int(value)
