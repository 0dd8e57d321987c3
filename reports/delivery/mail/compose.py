"""Build the report email: multipart text and HTML, stable Message-ID, no header injection.

The two headers that carry user text (``To``'s display name, and ``Subject``, which a template may
fill with a name) are written as finished header lines: plain ASCII when that is unambiguous,
RFC 2047 encoded words of our own otherwise. They never go through the email package's header
parser, which decodes an encoded word such as ``=?utf-8?q?Eve=0D=0ABcc:_x?=`` to a real CR LF and,
before Python 3.11.10 and 3.12.5 (CVE-2024-6923), writes it back out raw. That makes them safe on
every Python version, which is why ``requires-python`` stays at 3.11 (CI and this project's
machines run 3.11.7). :func:`check_header_block` then refuses a message whose header block holds a
line that is not one of our headers or a continuation of one.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import secrets
from datetime import UTC, datetime
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.policy import SMTP
from email.utils import format_datetime

from reports.content.render import RenderedReport
from reports.endpoints import is_header_url
from reports.errors import InvalidRecipient, UnsafeHeader
from reports.periods import Period
from reports.sender import parse_sender

#: C0 and C1 controls and the Unicode line and paragraph separators: anything a header may break on.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
#: ASCII only: an internationalized address needs SMTPUTF8 end to end, which is not assumed.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+"
_ADDRESS = re.compile(rf"{_ATOM}@(?:[A-Za-z0-9-]+\.)+[A-Za-z0-9-]+|{_ATOM}@localhost")
#: A display name written as it is: atoms and spaces. ``=`` and ``?`` are left out so that no
#: plain name can read as an encoded word; anything else is encoded.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+/^_`{|}~ -]+")
#: A subject written as it is: printable ASCII (an ``=?`` in it is encoded instead).
_PLAIN_SUBJECT = re.compile(r"[\x20-\x7e]+")

#: Longest display name kept, in characters: a 100,000-character name made a 100,026-character
#: ``To:`` line. 64 keeps a plain name and its header label on one 78-character line.
MAX_NAME_CHARS = 64
#: Longest subject kept, in characters.
MAX_SUBJECT_CHARS = 200
#: Folded header lines stay within this many characters (RFC 5322's recommended limit).
MAX_LINE = 78
#: UTF-8 bytes per encoded word: 42 bytes are 56 base64 characters, a 68-character word, within
#: RFC 2047's 75 and, after ``Subject: `` or a folding space, within one 78-character line.
_WORD_BYTES = 42

#: Raw header values are written exactly as built; a parsed header is still folded as usual.
POLICY = SMTP.clone(refold_source="none")


def message_id(period: Period, user_id: int, domain: str, *, request_id: str | None = None) -> str:
    """The same for every attempt and replay of one (period, user), so receivers can drop repeats.

    A ``send-now`` request that sends the report again gets its own, stable for that request:
    a send-now email is a new email, which a receiver must not drop as a repeat of the first.
    """
    suffix = f".{request_id}" if request_id else ""
    return f"<report.{period}.{user_id}{suffix}@{domain}>"


def display_name(name: str | None) -> str:
    """A user's name made safe for a header: control characters (CR, LF…) become one space,
    runs of spaces one space, and it is cut to :data:`MAX_NAME_CHARS` characters."""
    return _clean(name or "", MAX_NAME_CHARS)


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
    unsubscribe_url: str | None = None,
) -> bytes:
    """The message as it goes on the wire: multipart/alternative, text then HTML, CRLF line ends.

    Written directly rather than through ``EmailMessage``, whose header registry cost a
    millisecond a report: every header here is either fixed (``From``, folded once per setting),
    generated from ids, or built by :func:`to_header` and :func:`subject_header`; the header
    block is then checked as a whole (:func:`check_header_block`). Each part is 7bit where its
    text allows and quoted-printable otherwise (:func:`_encoded`); the boundary is one neither holds.

    :param unsubscribe_url: the user's one-click link (:meth:`reports.tokens.Links.url`),
        written as ``List-Unsubscribe`` with ``List-Unsubscribe-Post`` (RFC 8058); ``None`` writes
        neither (a message not for a user's report).
    """
    text_part, html_part = _part(b"plain", rendered.text), _part(b"html", rendered.html)
    boundary = _boundary(text_part, html_part)
    headers = b"".join(
        (
            _from_line(mail_from),
            b"To: ",
            to_header(to).encode("ascii"),
            CRLF,
            b"Subject: ",
            subject_header(rendered.subject).encode("ascii"),
            CRLF,
            b"Date: ",
            format_datetime(date.replace(tzinfo=UTC)).encode("ascii"),
            CRLF,
            b"Message-ID: ",
            message_id.encode("ascii"),
            CRLF,
            b"X-Report-Period: ",
            str(period).encode("ascii"),
            CRLF,
            b"X-Report-User-Id: ",
            str(user_id).encode("ascii"),
            CRLF,
            _unsubscribe_lines(unsubscribe_url),
            b"MIME-Version: 1.0",
            CRLF,
            b'Content-Type: multipart/alternative; boundary="',
            boundary,
            b'"',
            CRLF,
        )
    )
    check_header_block(headers)
    return b"".join(
        (
            headers,
            CRLF,
            b"--",
            boundary,
            CRLF,
            text_part,
            b"--",
            boundary,
            CRLF,
            html_part,
            b"--",
            boundary,
            b"--",
            CRLF,
        )
    )


CRLF = b"\r\n"

#: Longest line SMTP carries, CRLF excluded (RFC 5322 section 2.1.1).
MAX_WIRE_LINE = 998


def _boundary(*parts: bytes) -> bytes:
    """A random boundary no part contains (quoted-printable never holds ``=_``; 7bit text could,
    by a chance of one in 2**96, which is still checked rather than trusted)."""
    while True:
        boundary = f"=_{secrets.token_hex(12)}".encode("ascii")
        if not any(boundary in part for part in parts):
            return boundary


#: The header names :func:`compose` writes: a line of the header block is one of them or a
#: continuation of the one before.
HEADER_NAMES = (
    b"From:",
    b"To:",
    b"Subject:",
    b"Date:",
    b"Message-ID:",
    b"X-Report-Period:",
    b"X-Report-User-Id:",
    b"List-Unsubscribe:",
    b"List-Unsubscribe-Post:",
    b"MIME-Version:",
    b"Content-Type:",
)


def check_header_block(block: bytes) -> None:
    """Refuse a header block in which a line is neither one of our headers nor a continuation,
    or a CR or LF stands alone: whatever a name or a setting held, it cannot add a header."""
    lines = block.split(CRLF)
    if lines[-1] != b"" or any(b"\r" in line or b"\n" in line for line in lines):
        raise UnsafeHeader("A header would add a line of its own; the message was not sent.")
    for line in lines[:-1]:
        if not (line.startswith(HEADER_NAMES) or (line[:1] in (b" ", b"\t") and line.strip())):
            raise UnsafeHeader("A header would add a line of its own; the message was not sent.")


def _unsubscribe_lines(url: str | None) -> bytes:
    if url is None:
        return b""
    if not is_header_url(url):
        raise UnsafeHeader("The unsubscribe URL is not a plain http(s) URL; the message was not sent.")
    # RFC 8058: the POST a provider sends is exactly this body, to the https URL above.
    return b"".join(
        (
            b"List-Unsubscribe: <",
            url.encode("ascii"),
            b">",
            CRLF,
            b"List-Unsubscribe-Post: List-Unsubscribe=One-Click",
            CRLF,
        )
    )


@functools.lru_cache(maxsize=8)
def _from_line(mail_from: str) -> bytes:
    """The folded ``From`` line for the MAIL_FROM setting, read as the start-up check reads it
    (:func:`reports.sender.parse_sender`: an ASCII address, the domain in IDNA form): the email
    package's folding, once."""
    sender = parse_sender(mail_from)
    address = Address(display_name=sender.display_name, addr_spec=sender.address)
    return POLICY.fold_binary("From", POLICY.header_factory("From", address))


def _part(subtype: bytes, text: str) -> bytes:
    encoding, body = _encoded(text, html=subtype == b"html")
    return b"".join(
        (
            b"Content-Type: text/",
            subtype,
            b'; charset="utf-8"',
            CRLF,
            b"Content-Transfer-Encoding: ",
            encoding,
            CRLF,
            CRLF,
            # The CRLF before the next boundary belongs to the boundary, not to the text (RFC 2046).
            body,
            CRLF,
        )
    )


def _encoded(text: str, *, html: bool) -> tuple[bytes, bytes]:
    """The part's transfer encoding and its body with CRLF line ends.

    7bit when the text can go as it is: ASCII (HTML gets numeric character references, which
    mean the same there; the stylesheet is ASCII, checked when the template is built), no NUL
    and no CR (rendered text ends its lines in LF alone), and no line longer than SMTP carries.
    Otherwise quoted-printable, which costs more than rendering the HTML: every ``=`` of every
    attribute becomes ``=3D``.
    """
    if html or text.isascii():
        data = text.encode("ascii", "xmlcharrefreplace")
        if b"\r" not in data and b"\0" not in data and max(map(len, data.split(b"\n"))) <= MAX_WIRE_LINE:
            return b"7bit", data.replace(b"\n", CRLF)
    source = text.replace("\r\n", "\n").encode("utf-8")
    if b"\r" in source:
        # A lone CR (from a name, say) must not reach the wire bare (RFC 5321, 2.3.8: "<CR>.<CR><LF>"
        # ends the data for some servers). Text mode passes it through; binary mode writes it
        # =0D, line by line so that the line ends stay line ends.
        encoded = b"\n".join(binascii.b2a_qp(line, istext=False) for line in source.split(b"\n"))
    else:
        encoded = binascii.b2a_qp(source, istext=True)
    return b"quoted-printable", encoded.replace(b"\n", CRLF)


def to_header(to: Address) -> str:
    """The ``To`` header's value, folded: the cleaned display name, then ``<address>``."""
    name = display_name(to.display_name)
    if not name:
        return to.addr_spec
    address = f"<{to.addr_spec}>"
    lines = [name] if _PLAIN_NAME.fullmatch(name) else _encoded_words(name)
    # The first line follows "To: ", the others a folding space.
    room = MAX_LINE - (len("To: ") if len(lines) == 1 else 1) - len(lines[-1]) - 1
    if len(address) <= room:
        lines[-1] = f"{lines[-1]} {address}"
    else:
        lines.append(address)
    return "\r\n ".join(lines)


def subject_header(subject: str) -> str:
    """The ``Subject`` header's value, folded: one clean line, as it is or in encoded words."""
    text = _clean(subject, MAX_SUBJECT_CHARS)
    if _PLAIN_SUBJECT.fullmatch(text) and "=?" not in text and len("Subject: ") + len(text) <= MAX_LINE:
        return text
    return "\r\n ".join(_encoded_words(text))


def _clean(text: str, limit: int) -> str:
    # Cut after collapsing, so the cap counts what is shown; strip again, the cut may end on a space.
    return " ".join(_CONTROL.sub(" ", text).split())[:limit].strip()


def _encoded_words(text: str) -> list[str]:
    """``text`` as base64 UTF-8 encoded words, each holding whole characters (RFC 2047 §5).

    Whitespace between adjacent encoded words is not part of the text, so spaces are encoded
    inside the words, and a word ends after a space where it can: readers that, unlike RFC 2047,
    keep that whitespace (Python 3.11's address parser) then show at worst a doubled space, never
    a word split in two.
    """
    words: list[str] = []
    chunk = b""
    last_space = -1
    for char in text:
        encoded = char.encode("utf-8", "replace")
        if len(chunk) + len(encoded) > _WORD_BYTES:
            cut = last_space + 1 if last_space >= 0 else len(chunk)
            if len(chunk) - cut + len(encoded) > _WORD_BYTES:
                cut = len(chunk)  # what follows the space would still not fit with this character
            words.append(_word(chunk[:cut]))
            chunk, last_space = chunk[cut:], -1
        chunk += encoded
        if char == " ":
            last_space = len(chunk) - 1
    if chunk:
        words.append(_word(chunk))
    return words


def _word(data: bytes) -> str:
    return f"=?utf-8?b?{base64.b64encode(data).decode('ascii')}?="
