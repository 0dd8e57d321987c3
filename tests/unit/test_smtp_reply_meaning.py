"""What an SMTP reply says beyond its code, from a table of replies real servers give."""

from __future__ import annotations

import pytest

from reports.delivery.mail import replies


@pytest.mark.parametrize(
    ("code", "text", "about_rate"),
    [
        (450, "4.7.1 Error: too much mail from 127.0.0.1", True),
        (421, "4.7.0 Too many messages, try again later", True),
        (451, "4.7.1 Please try again later", True),
        (421, "Rate limit exceeded", True),
        (452, "Too much mail, slow down", True),
        (450, "4.7.1 <user@example.test>: Recipient address rejected: Greylisted for 60 seconds", False),
        (451, "4.3.0 Temporary lookup failure", False),
        (452, "4.2.2 Mailbox full", False),
        (421, "4.3.2 Service shutting down", False),
        (450, "4.2.0 The generated message could not be queued", False),
        (550, "5.7.1 Rate of messages exceeded", False),  # permanent: not a pace to follow
        # One user's mailbox receiving too fast (Gmail): that user's message waits, not the fleet.
        (
            450,
            "4.2.1 The user you are trying to contact is receiving mail at a rate that prevents additional messages "
            "from being delivered.",
            False,
        ),
    ],
)
def test_a_refusal_is_about_the_pace_when_its_code_or_words_say_so(code: int, text: str, about_rate: bool) -> None:
    assert replies.is_about_rate(code, text) is about_rate


@pytest.mark.parametrize(
    ("code", "text", "to_recipient", "about_address"),
    [
        (550, "5.1.1 <address>: Recipient address rejected: User unknown", True, True),
        (552, "5.2.2 Mailbox full", True, True),
        (550, "No such user", True, True),
        (554, "5.7.1 <address>: Relay access denied", True, False),
        (552, "5.3.4 Error: message file too big", False, False),
        (554, "5.6.0 Message content rejected", False, False),
        (550, "5.1.1 User unknown", False, True),  # after the data, but the code says it is the address
        (554, "Message rejected", False, False),
    ],
)
def test_a_refusal_is_about_the_address_by_its_enhanced_code_else_by_its_stage(
    code: int, text: str, to_recipient: bool, about_address: bool
) -> None:
    assert replies.is_about_address(code, text, to_recipient=to_recipient) is about_address


def test_the_enhanced_code_is_read_from_the_start_of_the_text_only() -> None:
    assert replies.enhanced_code("5.3.4 Error: message file too big") == (5, 3, 4)
    assert replies.enhanced_code("Error 5.3.4") is None
