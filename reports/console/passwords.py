"""Console passwords: Argon2id hashes (argon2-cffi's defaults, RFC 9106's second recommendation)."""

from __future__ import annotations

from collections.abc import Iterable

from argon2 import PasswordHasher, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError

from reports.console_settings import ConsoleUser

_HASHER = PasswordHasher()


def hash_password(password: str) -> str:
    """The PHC string for CONSOLE_USERS."""
    return _HASHER.hash(password)


def decoy(users: Iterable[ConsoleUser]) -> str:
    """A hash at the cost of the first user's, verified when a login names nobody: an unknown name
    then takes as long to refuse as a wrong password, and tells nothing."""
    first = next(iter(users), None)
    hasher = PasswordHasher.from_parameters(extract_parameters(first.password_hash)) if first else _HASHER
    return hasher.hash("no console user has this password")


def verify(user: ConsoleUser | None, password: str, *, decoy: str) -> bool:
    """Whether ``password`` is ``user``'s; ``False`` for no user, after the same work on ``decoy``."""
    try:
        return _HASHER.verify(user.password_hash if user else decoy, password) and user is not None
    except (VerificationError, InvalidHashError):
        return False
