"""The envelope's addresses (MAIL FROM, RCPT TO) are what smtplib would send, with or without its parser."""

from __future__ import annotations

import smtplib

import pytest

from reports.delivery.mail.smtp import envelope_address


@pytest.mark.parametrize(
    "address",
    [
        "ada@example.com",
        "user.name+tag@mail.example.co.uk",
        "o'neil@example.org",
        "a=b?c@example.org",
        "x@localhost",
        # Not dot-atoms: these go through smtplib's own parser, whatever it makes of them.
        "a..b@example.com",
        ".a@example.com",
        "a.@example.com",
        '"quoted local"@example.com',
        "x@[192.0.2.1]",
        "Name <ada@example.com>",
        " ada@example.com ",
        "ada@example.com\r\nRCPT TO:<eve@example.com>",
        "é@example.com",
        "a@b@c",
        "",
    ],
)
def test_an_address_is_quoted_as_smtplib_quotes_it(address: str) -> None:
    assert envelope_address(address) == smtplib.quoteaddr(address)


def test_a_plain_address_is_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_address: str) -> str:
        raise AssertionError("parsed")

    monkeypatch.setattr(smtplib, "quoteaddr", refuse)
    assert envelope_address("ada@example.com") == "<ada@example.com>"
