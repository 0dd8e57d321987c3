"""Building the report email: stable Message-ID, safe recipients, no header injection."""

from __future__ import annotations

import email
import email.header
import email.policy
import html
import re
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage

import pytest

from reports import tokens
from reports.content.render import RenderedReport
from reports.delivery.mail.compose import check_header_block, compose, display_name, message_id, recipient
from reports.errors import ConfigurationError, InvalidRecipient, PermanentError
from reports.periods import Period
from reports.settings import Settings

OCTOBER = Period(2026, 10)
INJECTION = "Mallory\r\nBcc: evil@example.com"


def rendered_factory(**overrides: str) -> RenderedReport:
    fields = {
        "subject": "Your activity report for October 2026",
        "text": "Hello Ada,\nTotal: 1,234.56 \u20ac\n",
        "html": "<p>Hello Ada,</p><p>Total: 1,234.56 \u20ac</p>\n",
    }
    return RenderedReport(**{**fields, **overrides})


def compose_for(
    to: Address,
    *,
    user_id: int = 42,
    period: Period = OCTOBER,
    rendered: RenderedReport | None = None,
    **overrides: object,
) -> bytes:
    arguments: dict[str, object] = {
        "to": to,
        "mail_from": "Monthly Reports <reports@reports.test>",
        "period": period,
        "user_id": user_id,
        "date": datetime(2026, 11, 1, 6, 0),
        "message_id": message_id(period, user_id, "reports.test"),
        "unsubscribe_url": f"https://reports.test/u/{user_id}.abcd.0123456789abcdefghij_-",
        **overrides,
    }
    return compose(rendered or rendered_factory(), **arguments)  # type: ignore[arg-type]


def header_lines(raw: bytes) -> list[bytes]:
    """The header block's physical lines, before the first empty line."""
    return raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")


def reparse(message: bytes) -> EmailMessage:
    """The message as a mail reader parses it."""
    return email.message_from_bytes(message, policy=email.policy.default)  # type: ignore[return-value]


# --- message_id ------------------------------------------------------------------------------


def test_the_message_id_names_the_period_and_user_under_the_domain() -> None:
    assert message_id(OCTOBER, 42, "reports.test") == "<report.2026-10.42@reports.test>"


def test_the_message_id_is_the_same_on_every_call_for_the_same_period_and_user() -> None:
    assert message_id(Period(2026, 10), 42, "reports.test") == message_id(Period.parse("2026-10"), 42, "reports.test")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((Period(2026, 10), 42), (Period(2026, 11), 42)),
        ((Period(2026, 10), 42), (Period(2026, 10), 43)),
        ((Period(2026, 1), 12), (Period(2026, 11), 2)),
        ((Period(2026, 10), 1), (Period(2026, 10), 11)),
    ],
)
def test_different_periods_or_users_get_different_message_ids(a: tuple[Period, int], b: tuple[Period, int]) -> None:
    assert message_id(*a, "reports.test") != message_id(*b, "reports.test")


def test_a_composed_message_carries_the_same_message_id_on_every_attempt() -> None:
    to = recipient("ada@example.com", "Ada")
    first = compose_for(to, date=datetime(2026, 11, 1, 6, 0))
    retry = compose_for(to, date=datetime(2026, 11, 1, 9, 30))
    assert reparse(first)["Message-ID"] == reparse(retry)["Message-ID"] == "<report.2026-10.42@reports.test>"


# --- display_name ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Ada Lovelace", "Ada Lovelace"),
        (None, ""),
        ("", ""),
        (INJECTION, "Mallory Bcc: evil@example.com"),
        ("Ada\nBcc: evil@example.com", "Ada Bcc: evil@example.com"),
        ("Ada\rBcc: evil@example.com", "Ada Bcc: evil@example.com"),
        ("Ada\r\n\r\n\tLovelace", "Ada Lovelace"),
        ("\x00Ada\x1b[31m\x7f", "Ada [31m"),
        ("  Ada  ", "Ada"),
        ("Zo\u00eb \u00c5str\u00f6m", "Zo\u00eb \u00c5str\u00f6m"),
    ],
)
def test_display_name_replaces_control_characters_with_one_space(name: str | None, expected: str) -> None:
    assert display_name(name) == expected


@pytest.mark.parametrize("name", [INJECTION, "a\x00b\x01c\x1fd\x7fe\tf\x0bg\x0ch"])
def test_display_name_never_contains_a_control_character(name: str) -> None:
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in display_name(name))


# --- recipient -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "username", "domain"),
    [
        ("ada@example.com", "ada", "example.com"),
        ("first.last+tag@mail.example.co.uk", "first.last+tag", "mail.example.co.uk"),
        ("root@localhost", "root", "localhost"),
        ("user42@example.test", "user42", "example.test"),
    ],
)
def test_a_valid_address_becomes_the_recipient(address: str, username: str, domain: str) -> None:
    to = recipient(address, "Ada")
    assert (to.username, to.domain, to.addr_spec) == (username, domain, address)
    assert to.display_name == "Ada"


def test_the_recipients_name_is_made_safe_for_a_header() -> None:
    assert recipient("ada@example.com", INJECTION).display_name == "Mallory Bcc: evil@example.com"


@pytest.mark.parametrize(
    "address",
    [
        pytest.param("ada.example.com", id="no-at"),
        pytest.param("ada @example.com", id="space-in-local-part"),
        pytest.param("ada@exa mple.com", id="space-in-domain"),
        pytest.param("ada@example.com\r\nBcc: evil@example.com", id="crlf-header"),
        pytest.param("ada\r\n@example.com", id="crlf-in-local-part"),
        pytest.param("ada@exam\nple.com", id="lf-in-domain"),
        pytest.param("ada@b@example.com", id="two-ats"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("a@b", id="no-dot-in-domain"),
        pytest.param("a@b.", id="nothing-after-dot"),
        pytest.param("@example.com", id="no-local-part"),
        pytest.param("ada@", id="no-domain"),
        pytest.param("<ada@example.com>", id="angle-brackets"),
        pytest.param("Ada <ada@example.com>", id="with-display-name"),
        pytest.param("ada@example.com, evil@example.com", id="two-addresses"),
        pytest.param("ada@localhost.evil@example.com", id="localhost-then-more"),
        pytest.param(None, id="none"),
    ],
)
def test_an_invalid_address_is_rejected(address: object) -> None:
    with pytest.raises(InvalidRecipient):
        recipient(address, "Ada")  # type: ignore[arg-type]


def test_an_invalid_recipient_is_a_permanent_failure() -> None:
    with pytest.raises(PermanentError):
        recipient("not an address", "Ada")


# --- compose ---------------------------------------------------------------------------------


def test_a_name_with_an_injected_bcc_adds_no_header() -> None:
    message = compose_for(recipient("ada@example.com", INJECTION))
    raw = message
    lines = header_lines(raw)
    assert not [line for line in lines if line.lower().startswith(b"bcc:")]
    assert len([line for line in lines if line.lower().startswith(b"to:")]) == 1

    parsed = reparse(message)
    assert parsed["Bcc"] is None
    assert len(parsed.get_all("To") or []) == 1
    assert [a.addr_spec for a in parsed["To"].addresses] == ["ada@example.com"]


def test_the_report_headers_are_present() -> None:
    parsed = reparse(compose_for(recipient("ada@example.com", "Ada"), user_id=42, period=Period(2026, 10)))
    assert parsed["X-Report-Period"] == "2026-10"
    assert parsed["X-Report-User-Id"] == "42"
    assert parsed["Message-ID"] == "<report.2026-10.42@reports.test>"
    assert parsed["Subject"] == "Your activity report for October 2026"
    assert parsed["From"].addresses[0].addr_spec == "reports@reports.test"
    assert parsed["Date"].datetime == datetime(2026, 11, 1, 6, 0, tzinfo=UTC)
    assert [(a.display_name, a.addr_spec) for a in parsed["To"].addresses] == [("Ada", "ada@example.com")]


@pytest.mark.parametrize(
    "header",
    [
        "To",
        "From",
        "Subject",
        "Date",
        "Message-ID",
        "X-Report-Period",
        "X-Report-User-Id",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
    ],
)
def test_each_header_appears_exactly_once(header: str) -> None:
    parsed = reparse(compose_for(recipient("ada@example.com", INJECTION)))
    assert len(parsed.get_all(header) or []) == 1


def test_the_message_carries_one_click_unsubscribe_headers() -> None:
    parsed = reparse(compose_for(recipient("ada@example.com", "Ada"), user_id=42))
    assert parsed["List-Unsubscribe"] == "<https://reports.test/u/42.abcd.0123456789abcdefghij_->"
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


@pytest.mark.parametrize(
    "url",
    [
        "https://reports.test/u/1>, <mailto:evil@example.com",
        "https://reports.test/u/1\r\nBcc: evil@example.com",
        "https://reports.test/u/1 x",
        "https://réports.test/u/1",
        "javascript:alert(1)",
    ],
)
def test_an_unsubscribe_url_that_could_bend_the_header_is_refused(url: str) -> None:
    with pytest.raises(PermanentError):
        compose_for(recipient("ada@example.com", "Ada"), unsubscribe_url=url)


def test_the_message_is_multipart_alternative_with_a_text_and_an_html_part() -> None:
    rendered = rendered_factory()
    parsed = reparse(compose_for(recipient("ada@example.com", "Ada")))
    assert parsed.get_content_type() == "multipart/alternative"
    parts = list(parsed.iter_parts())
    assert [part.get_content_type() for part in parts] == ["text/plain", "text/html"]
    # On the wire every line ends in CRLF; the content is otherwise what was rendered (in the
    # HTML, "€" may travel as the character reference "&#8364;": the same text to a reader).
    assert parts[0].get_content().replace("\r\n", "\n") == rendered.text
    assert html.unescape(parts[1].get_content().replace("\r\n", "\n")) == rendered.html


def parts_of(rendered: RenderedReport) -> list[EmailMessage]:
    return list(reparse(compose_for(recipient("ada@example.com", "Ada"), rendered=rendered)).iter_parts())


def test_an_ascii_report_travels_unencoded() -> None:
    rendered = rendered_factory(
        text="Hello Ada,\nTotal: $1,234.56\n", html='<p style="color:#111">Total: $1,234.56</p>\n'
    )
    text, page = parts_of(rendered)
    assert [text["Content-Transfer-Encoding"], page["Content-Transfer-Encoding"]] == ["7bit", "7bit"]
    assert (text.get_content().replace("\r\n", "\n"), page.get_content().replace("\r\n", "\n")) == (
        rendered.text,
        rendered.html,
    )


def test_non_ascii_html_travels_as_character_references_and_reads_the_same() -> None:
    rendered = rendered_factory(html="<p>Gr\u00fc\u00dfe, Zo\u00eb \u25b2 1.234,56\u00a0\u20ac \U0001f600</p>\n")
    page = parts_of(rendered)[1]
    assert page["Content-Transfer-Encoding"] == "7bit"
    assert page.get_content().isascii()
    assert html.unescape(page.get_content().replace("\r\n", "\n")) == rendered.html


@pytest.mark.parametrize(
    ("text", "page", "encodings"),
    [
        pytest.param("Gr\u00fc\u00dfe\n", "<p>ok</p>\n", ("quoted-printable", "7bit"), id="non-ascii-text"),
        pytest.param(
            "ok\n", "<p>" + "x" * 999 + "</p>\n", ("7bit", "quoted-printable"), id="html-line-longer-than-smtp-carries"
        ),
        pytest.param("a\x00b\n", "<p>a\rb</p>\n", ("quoted-printable", "quoted-printable"), id="nul-and-bare-cr"),
        # A name with a CR in a template that puts it in as it is: "<CR>.<CR><LF>" ends the data
        # for some servers.
        pytest.param("Hello Eve\r.\r\nQUIT,\n", "<p>ok</p>\n", ("quoted-printable", "7bit"), id="cr-dot-in-text"),
        pytest.param("ok\n", "<p>Z\u00f6e\r.</p>\n", ("7bit", "quoted-printable"), id="cr-dot-in-html"),
    ],
)
def test_a_part_that_cannot_travel_as_it_is_is_quoted_printable_and_decodes_exactly(
    text: str, page: str, encodings: tuple[str, str]
) -> None:
    raw = compose_for(recipient("ada@example.com", "Ada"), rendered=rendered_factory(text=text, html=page))
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    assert b"\r" not in raw.replace(b"\r\n", b""), "a bare CR on the wire"
    parts = list(reparse(raw).iter_parts())
    assert tuple(part["Content-Transfer-Encoding"] for part in parts) == encodings
    for part, written in zip(parts, (text, page), strict=True):
        # Line ends travel as CRLF and read back as LF, however they were written.
        assert part.get_payload(decode=True).decode("utf-8").replace("\r\n", "\n") == written.replace("\r\n", "\n")


def test_the_serialized_message_uses_crlf_line_endings_only() -> None:
    raw = compose_for(recipient("ada@example.com", INJECTION))
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert b"\r" not in raw.replace(b"\r\n", b"")


@pytest.mark.parametrize("address", ["\u00fcser@example.com", "user@ex\u00e4mple.com"])
def test_a_non_ascii_address_is_rejected_or_written_as_a_valid_to_header(address: str) -> None:
    # Either the address is refused up front (a permanent failure), or the To header must carry it
    # as a parseable address: an RFC 2047 encoded-word inside an addr-spec is not one.
    try:
        to = recipient(address, "Ada")
    except InvalidRecipient:
        return
    parsed = reparse(compose_for(to))
    assert parsed["To"].defects == ()
    assert [a.addr_spec for a in parsed["To"].addresses] == [address]


# --- user text cannot add a header line, on any Python version ---------------------------------

#: The headers compose sets, in order; a message with any other header line was injected into.
OUR_HEADERS = [
    "From",
    "To",
    "Subject",
    "Date",
    "Message-ID",
    "X-Report-Period",
    "X-Report-User-Id",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "MIME-Version",
    "Content-Type",
]

ATTACKS = [
    pytest.param(INJECTION, id="crlf"),
    pytest.param("=?utf-8?q?Eve=0D=0ABcc:_x@evil.test?=", id="encoded-word-crlf-bcc"),
    pytest.param("=?utf-8?q?Eve=0D=0A=0D=0AYour_account_is_closed?=", id="encoded-word-blank-line-body"),
    pytest.param("=?utf-8?b?RXZlDQpCY2M6IHhAZXZpbC50ZXN0?=", id="base64-encoded-word-crlf-bcc"),
    pytest.param("Eve =?iso-8859-1?q?=0ABcc:_x@evil.test?= Smith", id="encoded-word-lf-mid-name"),
    pytest.param("Eve\u2028Bcc: x@evil.test", id="unicode-line-separator"),
    pytest.param("Eve\x85Bcc: x@evil.test", id="next-line-control"),
]


def header_names(raw: bytes) -> list[str]:
    """The name of every header line in the block that is not a continuation."""
    return [line.split(b":", 1)[0].decode() for line in header_lines(raw) if line[:1] not in (b" ", b"\t")]


def assert_only_our_headers_and_the_body_intact(message: bytes) -> EmailMessage:
    raw = message
    assert header_names(raw) == OUR_HEADERS
    assert all(len(line) <= 78 for line in header_lines(raw))
    parsed = reparse(message)
    assert parsed.keys() == OUR_HEADERS
    assert parsed["Bcc"] is None
    assert [a.addr_spec for a in parsed["To"].addresses] == ["ada@example.com"]
    assert parsed.get_body(("plain",)).get_content().replace("\r\n", "\n") == rendered_factory().text
    return parsed


@pytest.mark.parametrize("name", ATTACKS)
def test_a_hostile_name_adds_no_header_line_and_leaves_the_body_alone(name: str) -> None:
    message = compose_for(recipient("ada@example.com", name))
    parsed = assert_only_our_headers_and_the_body_intact(message)
    # Shown as the text it is, not decoded a second time into a line break.
    assert rfc2047_display_name(message) == display_name(name)
    assert not re.search(r"[\r\n]", parsed["To"].addresses[0].display_name)


@pytest.mark.parametrize("name", ATTACKS)
def test_a_hostile_name_in_the_subject_adds_no_header_line(name: str) -> None:
    subject = f"Your report, {name}"
    parsed = assert_only_our_headers_and_the_body_intact(compose_with_subject(subject))
    assert str(parsed["Subject"]) == " ".join(re.sub(r"[\r\n\x85\u2028]", " ", subject).split())


def compose_with_subject(subject: str) -> bytes:
    return compose(
        rendered_factory(subject=subject),
        to=recipient("ada@example.com", "Ada"),
        mail_from="Reports <reports@reports.test>",
        period=OCTOBER,
        user_id=42,
        date=datetime(2026, 11, 1, 6, 0),
        message_id=message_id(OCTOBER, 42, "reports.test"),
        unsubscribe_url="https://reports.test/u/42.abcd.0123456789abcdefghij_-",
    )


def header_field(raw: bytes, name: bytes) -> list[bytes]:
    """The physical lines of one header field: its first line and its continuations."""
    lines = header_lines(raw)
    for start, line in enumerate(lines):
        if line.lower().startswith(name.lower() + b":"):
            end = start + 1
            while end < len(lines) and lines[end][:1] in (b" ", b"\t"):
                end += 1
            return lines[start:end]
    return []


def test_a_hundred_thousand_character_name_is_cut_to_sixty_four_characters() -> None:
    message = compose_for(recipient("ada@example.com", "x" * 100_000))
    assert len(b"".join(header_field(message, b"To"))) < 100
    assert reparse(message)["To"].addresses[0].display_name == "x" * 64


def test_a_long_non_ascii_name_is_cut_on_a_character_boundary() -> None:
    name = "\U0001f600\u00e9" * 50_000
    message = compose_for(recipient("ada@example.com", name))
    assert_only_our_headers_and_the_body_intact(message)
    assert len(b"".join(header_field(message, b"To"))) < 500
    assert rfc2047_display_name(message) == name[:64]


def rfc2047_display_name(message: bytes) -> str:
    """The To header's display name as an RFC 2047 reader shows it (whitespace between adjacent
    encoded words is no part of the text: what Gmail, Outlook and Thunderbird do)."""
    to = str(email.message_from_bytes(message, policy=email.policy.compat32)["To"])
    decoded = str(email.header.make_header(email.header.decode_header(to)))
    return decoded.rsplit(" <", 1)[0]


@pytest.mark.parametrize(
    "name",
    [
        "Zo\u00eb \u00c5str\u00f6m",
        "Jos\u00e9 Mar\u00eda Garc\u00eda",
        "\u674e\u5c0f\u9f8d",
        "Fran\u00e7ois O'Brien",
        "\u0410\u043b\u0435\u043a\u0441\u0430\u043d\u0434\u0440 \u041f\u0443\u0448\u043a\u0438\u043d",
        "\U0001f600 Smiley",
        "Lovelace, Ada",
        'Ada "the Countess" L.',
        "Ada (admin)",
        "Ada Lovelace",
        "=?utf-8?q?Ada?=",
    ],
)
def test_a_name_is_shown_by_a_mail_reader_exactly_as_it_is(name: str) -> None:
    message = compose_for(recipient("ada@example.com", name))
    assert reparse(message)["To"].addresses[0].display_name == name
    assert rfc2047_display_name(message) == name


@pytest.mark.parametrize(
    "name",
    [
        (
            "\u0410\u043b\u0435\u043a\u0441\u0430\u043d\u0434\u0440 \u0421\u0435\u0440\u0433\u0435\u0435\u0432\u0438\u0447"
            " \u041f\u0443\u0448\u043a\u0438\u043d"
        ),
        "\u674e\u5c0f\u9f8d" * 21,
        "Zo\u00eb \u00c5str\u00f6m-" * 5,
    ],
)
def test_a_name_too_long_for_one_encoded_word_is_shown_exactly_by_an_rfc_2047_reader(name: str) -> None:
    cleaned = display_name(name)
    message = compose_for(recipient("ada@example.com", name))
    assert rfc2047_display_name(message) == cleaned
    # Python's own address parser (every version up to 3.13) keeps the folding space between two
    # encoded words, which RFC 2047 says is no part of the text: it shows the same characters,
    # only spaced apart where one word ends.
    assert reparse(message)["To"].addresses[0].display_name.replace(" ", "") == cleaned.replace(" ", "")


def test_a_non_ascii_subject_is_shown_exactly() -> None:
    subject = "Votre relev\u00e9 d'activit\u00e9 pour octobre 2026, Zo\u00eb \u00c5str\u00f6m \u2014 " * 3
    message = compose_with_subject(subject)
    assert_only_our_headers_and_the_body_intact(message)
    assert str(reparse(message)["Subject"]) == " ".join(subject.split())


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b"Subject: Hello\r\nBcc: x@evil.test\r\n", id="a-line-of-its-own"),
        pytest.param(b"Subject: Hello\nBcc: x@evil.test\r\n", id="a-bare-lf"),
        pytest.param(b"Subject: Hello\rBcc: x@evil.test\r\n", id="a-bare-cr"),
        pytest.param(b"Subject: Hello\r\n\r\nYour account is closed\r\n", id="a-blank-line-then-a-body"),
        pytest.param(b"Subject: Hello", id="an-unended-block"),
    ],
)
def test_a_header_block_that_would_add_a_line_of_its_own_is_refused(block: bytes) -> None:
    with pytest.raises(PermanentError, match="add a line"):
        check_header_block(block)


def test_a_folded_header_block_is_accepted() -> None:
    check_header_block(b"Subject: =?utf-8?b?QQ==?=\r\n =?utf-8?b?Qg==?=\r\nTo: ada@example.com\r\n")


# --- the sender and the link base: the start-up check's reading is the composer's -------------


def test_an_internationalised_sender_domain_is_written_in_its_idna_form() -> None:
    raw = compose_for(Address("Ada", "ada", "example.com"), mail_from="Reports <reports@exämple.com>")
    assert b"From: Reports <reports@xn--exmple-cua.com>\r\n" in raw
    assert reparse(raw)["From"].addresses[0].domain == "xn--exmple-cua.com"


def test_a_non_ascii_sender_name_is_encoded_and_reads_back_exactly() -> None:
    raw = compose_for(Address("Ada", "ada", "example.com"), mail_from="Société Générale <rapports@exämple.fr>")
    assert raw.split(b"\r\n\r\n", 1)[0].isascii()
    sender = reparse(raw)["From"].addresses[0]
    assert (sender.display_name, sender.addr_spec) == ("Société Générale", "rapports@xn--exmple-cua.fr")


@pytest.mark.parametrize(
    "mail_from",
    ["Reports <rép@example.com>", "Reports", "a@example.com, b@example.com", "Reports <reports@exa mple.com>"],
)
def test_a_sender_that_start_up_refuses_is_refused_by_the_composer_in_the_same_words(mail_from: str) -> None:
    with pytest.raises(ConfigurationError) as at_start:
        Settings(mail_from=mail_from)
    with pytest.raises(ConfigurationError) as composing:
        compose_for(Address("Ada", "ada", "example.com"), mail_from=mail_from)
    assert str(composing.value) == str(at_start.value)
    assert str(at_start.value).startswith("MAIL_FROM must be")


@pytest.mark.parametrize(
    "base",
    [
        "https://reports.example.com",
        "https://reports.example.com/a,b",
        "https://reports.example.com/mail;v=1",
        "https://reports.example.com:8443/path/~x/",
        "https://reports.example.com/a'b(c)*",
        "http://127.0.0.1:8000",
    ],
)
def test_every_public_base_url_start_up_accepts_makes_links_the_composer_accepts(base: str) -> None:
    """The two checks cannot disagree: a base that passes start-up never fails every email."""
    try:
        settings = Settings(public_base_url=base, unsubscribe_secret="s" * 32)
    except ConfigurationError as refused:
        assert str(refused).startswith("PUBLIC_BASE_URL must be")
        return
    link = tokens.links(settings).url(2_147_483_647)
    raw = compose_for(Address("Ada", "ada", "example.com"), unsubscribe_url=link)
    assert reparse(raw)["List-Unsubscribe"] == f"<{link}>"


def test_a_public_base_url_with_a_comma_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError, match="PUBLIC_BASE_URL must be .*no comma"):
        Settings(public_base_url="https://host.example/a,b", unsubscribe_secret="s" * 32)
