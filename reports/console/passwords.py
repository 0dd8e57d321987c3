"""Console passwords: Argon2id hashes (argon2-cffi's defaults, RFC 9106's second recommendation)."""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from reports.console_settings import ConsoleUser

_HASHER = PasswordHasher()

#: Verified against when the name is unknown, so that an unknown name takes as long as a wrong password.
_UNKNOWN = _HASHER.hash("no console user has this password")


def hash_password(password: str) -> str:
    """The PHC string for CONSOLE_USERS."""
    return _HASHER.hash(password)


def verify(user: ConsoleUser | None, password: str) -> bool:
    """Whether ``password`` is ``user``'s; ``False`` for no user, after the same work."""
    try:
        return _HASHER.verify(user.password_hash if user else _UNKNOWN, password) and user is not None
    except (VerificationError, InvalidHashError):
        return False
