"""Unsubscribe links: a per-user token signed with UNSUBSCRIBE_SECRET, and its check.

A token is ``<user_id>.<key_id>.<signature>``: the signature is the first 22 characters (132 bits)
of base64url(HMAC-SHA256(secret, "unsub:<user_id>")), and the key id names which secret signed it.
UNSUBSCRIBE_SECRET holds one or more secrets, newest first: links are signed with the first and
any of them is accepted, so a rotation that keeps the old secret second for a while (longer than
mail sits unread: months) breaks no link already sent. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import hmac
import re
from dataclasses import dataclass

from reports.endpoints import DEV_SECRET, parse_secrets
from reports.jobs import MAX_USER_ID, MIN_USER_ID, USER_ID_PATTERN
from reports.settings import Settings

#: Characters of the base64url signature kept: 132 bits, beyond any guessing over HTTP.
SIGNATURE_CHARS = 22

#: Characters of a key id: enough to tell a handful of live secrets apart.
KEY_ID_CHARS = 4

#: The path every link starts with, below PUBLIC_BASE_URL.
PATH_PREFIX = "/u/"

_TOKEN = re.compile(rf"({USER_ID_PATTERN})\.([A-Za-z0-9_-]{{{KEY_ID_CHARS}}})\.([A-Za-z0-9_-]{{{SIGNATURE_CHARS}}})")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def key_id(secret: bytes) -> str:
    """A short public name for ``secret``, derived through HMAC so it says nothing about the secret."""
    return _b64(hmac.digest(secret, b"unsub-key-id", "sha256"))[:KEY_ID_CHARS]


@dataclass(frozen=True)
class Signer:
    """Signs and checks unsubscribe tokens; build it once per process (:meth:`from_secrets`)."""

    #: (key id, secret) pairs, the signing one first.
    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def from_secrets(cls, secrets: tuple[str, ...]) -> Signer:
        if not secrets:
            raise ValueError("At least one secret is needed.")
        return cls(tuple((key_id(s.encode()), s.encode()) for s in secrets))

    def token(self, user_id: int) -> str:
        kid, secret = self.keys[0]
        return f"{user_id}.{kid}.{_signature(secret, user_id)}"

    def user_id(self, token: str) -> int | None:
        """The user a token was signed for, or ``None`` for anything forged, altered or malformed."""
        match = _TOKEN.fullmatch(token)
        if match is None:
            return None
        user_id = int(match.group(1))
        # The column is 32-bit: a longer id is refused before its signature is computed.
        if not MIN_USER_ID <= user_id <= MAX_USER_ID:
            return None
        given = match.group(3).encode("ascii")
        valid = False
        # Every key is tried, the key id only selects which result counts: the time taken does
        # not tell a known key id from an unknown one, nor a near-miss signature from a far one.
        for kid, secret in self.keys:
            same = hmac.compare_digest(_signature(secret, user_id).encode("ascii"), given)
            valid |= same and hmac.compare_digest(kid, match.group(2))
        return user_id if valid else None


def _signature(secret: bytes, user_id: int) -> str:
    return _b64(hmac.digest(secret, f"unsub:{user_id}".encode("ascii"), "sha256"))[:SIGNATURE_CHARS]


@dataclass(frozen=True)
class Links:
    """Every user's unsubscribe URL under PUBLIC_BASE_URL."""

    base_url: str
    signer: Signer

    def url(self, user_id: int) -> str:
        return f"{self.base_url}{PATH_PREFIX}{self.signer.token(user_id)}"


def links(settings: Settings) -> Links:
    """The unsubscribe links of this deployment; build once per process and keep."""
    secrets = parse_secrets(settings.unsubscribe_secret) or (DEV_SECRET,)
    return Links(settings.public_base_url.rstrip("/"), Signer.from_secrets(secrets))
