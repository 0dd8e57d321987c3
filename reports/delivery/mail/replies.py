"""What an SMTP reply says beyond its code: about the pace, about the address, or about the message.

Pure functions of the reply's code and text (RFC 3463 enhanced status codes, where the server
gives one; the text where it does not).
"""

from __future__ import annotations

import re

#: ``4.7.1``, ``5.3.4``: class, subject, detail (RFC 3463), at the start of the text.
_ENHANCED = re.compile(r"^\s*([245])\.(\d{1,3})\.(\d{1,3})\b")

#: Words with which servers say the client sends too fast (Postfix "too much mail", "rate limit").
_RATE_WORDS = re.compile(r"\brate|too much mail|too many messages", re.IGNORECASE)

#: Greylisting also answers 4.7.x at times; it is about this message's first try, not the pace.
_GREYLIST = re.compile(r"greylist|graylist", re.IGNORECASE)

#: Enhanced-code subjects about the recipient: 1 addressing, 2 the mailbox (RFC 3463 section 3).
_ADDRESS_SUBJECTS = frozenset({1, 2})


def enhanced_code(text: str) -> tuple[int, int, int] | None:
    """The enhanced status code at the start of a reply's text, or ``None``."""
    match = _ENHANCED.match(text)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def is_about_rate(code: int, text: str) -> bool:
    """Whether a 4xx refusal is about how fast the fleet sends: a 4.7.x security/policy code
    (not greylisting), or text that says "rate" or "too much mail" under no enhanced code about
    the recipient (Gmail's ``450 4.2.1 … receiving mail at a rate …`` is one user's mailbox)."""
    if not 400 <= code < 500:
        return False
    enhanced = enhanced_code(text)
    if enhanced is not None and enhanced[1] == 7 and not _GREYLIST.search(text):
        return True
    if enhanced is not None and enhanced[1] in _ADDRESS_SUBJECTS:
        return False
    return bool(_RATE_WORDS.search(text))


def is_about_address(code: int, text: str, *, to_recipient: bool) -> bool:
    """Whether a 5xx refusal is about the recipient's address rather than the message or the
    sender (size, content, policy: what would refuse every user alike).

    An enhanced code says so whatever the stage: ``5.1.x`` (addressing) and ``5.2.x`` (the
    mailbox) are about the address, any other subject (``5.7.1`` relaying denied, ``5.3.4`` too
    big) is not. Without one, a reply to RCPT TO is about the address and a reply to the data is not.
    """
    enhanced = enhanced_code(text)
    if enhanced is None:
        return to_recipient
    return enhanced[1] in _ADDRESS_SUBJECTS
