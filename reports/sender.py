"""MAIL_FROM read as the sender every email carries: one parse, used by the start-up check and by
the composer, so a sender that passes at start is one that every email can carry.

SMTP without SMTPUTF8 (which is not assumed) carries ASCII addresses only. An internationalised
domain (``exämple.com``) is written in its IDNA form (``xn--exmple-cua.com``), which every
mail server resolves to the same domain; a local part outside ASCII has no such form and is
refused. The display name may be any text: the ``From`` header encodes it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from email.policy import SMTP

import idna

from reports.errors import ConfigurationError

#: An ASCII local part, as the recipients' addresses are checked (dot-atom characters).
_LOCAL_PART = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+")
#: One label of an ASCII domain name.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
#: Controls and the Unicode line separators: a setting that holds one could break the header.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class Sender:
    """The sender of every report, as the headers and the SMTP envelope carry it."""

    display_name: str
    local_part: str
    #: ASCII: an internationalised domain in its IDNA form. Stable Message-IDs are minted under it.
    domain: str
    #: The domain as MAIL_FROM writes it, for people: the report's footer.
    shown_domain: str

    @property
    def address(self) -> str:
        """The address on the wire: the SMTP envelope's ``MAIL FROM`` and the ``From`` header."""
        return f"{self.local_part}@{self.domain}"

    @property
    def shown_address(self) -> str:
        return f"{self.local_part}@{self.shown_domain}"


@functools.lru_cache(maxsize=8)
def parse_sender(mail_from: str) -> Sender:
    """MAIL_FROM as one ASCII-addressed sender, or :class:`ConfigurationError` in one line."""
    header = None if _CONTROL.search(mail_from) else SMTP.header_factory("From", mail_from)
    if header is None or header.defects or len(header.addresses) != 1:
        raise _refused(mail_from, "one address, such as Acme Reports <reports@acme.example>")
    [address] = header.addresses
    if not _LOCAL_PART.fullmatch(address.username) or ".." in address.username:
        raise _refused(mail_from, "an address whose part before the @ is ASCII (mail servers need SMTPUTF8 otherwise)")
    return Sender(
        display_name=address.display_name,
        local_part=address.username,
        domain=_ascii_domain(address.domain, mail_from),
        shown_domain=address.domain,
    )


def _ascii_domain(domain: str, mail_from: str) -> str:
    try:
        # Checks an ASCII domain too: an ``xn--`` label must decode.
        encoded = idna.encode(domain, uts46=True).decode("ascii")
    except idna.IDNAError:
        encoded = ""
    labels = encoded.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or (len(labels) < 2 and encoded != "localhost"):
        raise _refused(mail_from, "an address whose domain is a valid domain name")
    # An ASCII domain is kept as written, case too: the Message-IDs already sent were minted under it.
    return domain if domain.isascii() else encoded


def _refused(mail_from: str, what: str) -> ConfigurationError:
    return ConfigurationError(f"MAIL_FROM must be {what}, got {mail_from!r}.")
