"""The console's settings parsed and checked: ``CONSOLE_USERS`` as its users, so that a malformed
entry stops start-up in one line that shows no hash."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Protocol

from reports.errors import ConfigurationError

#: Shortest CONSOLE_SECRET accepted, in characters.
MIN_CONSOLE_SECRET_CHARS = 32


class ConsoleSettings(Protocol):
    """What the console reads of the settings (:class:`reports.settings.Settings` has it)."""

    @property
    def console_users(self) -> str: ...
    @property
    def console_secret(self) -> str | None: ...


class Role(enum.StrEnum):
    #: Sees everything and acts.
    ADMIN = "admin"
    #: Sees everything, changes nothing.
    VIEWER = "viewer"


@dataclass(frozen=True)
class ConsoleUser:
    name: str
    role: Role
    #: The Argon2 hash ``reports console hash-password`` printed (PHC string format).
    password_hash: str = ""

    def __repr__(self) -> str:
        # The hash is a secret's digest: no repr of it lands in a log or a traceback.
        return f"ConsoleUser(name={self.name!r}, role={self.role.value!r})"


#: The start of one entry: a name, a role, and an Argon2 PHC string. An Argon2 hash holds commas
#: itself (``m=65536,t=3,p=4``), so a comma starts a new entry only before such a start.
_ENTRY_START = re.compile(r"\s*[^\s:,$]+:[a-z]+:\$argon2")
_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9_.@-]{1,64}):(?P<role>[a-z]+):(?P<hash>\$argon2(?:id|i|d)\$\S+)")


def users(settings: ConsoleSettings) -> dict[str, ConsoleUser]:
    """CONSOLE_USERS by name; empty when unset (the console then answers 404)."""
    found: dict[str, ConsoleUser] = {}
    for entry in _entries(settings.console_users):
        match = _ENTRY.fullmatch(entry)
        name = entry.split(":", 1)[0]
        if match is None:
            raise ConfigurationError(
                "CONSOLE_USERS must be comma-separated name:role:argon2-hash entries (the hash as "
                f"`reports console hash-password` prints it); the entry for {name[:64]!r} is not."
            )
        if match["role"] not in {role.value for role in Role}:
            raise ConfigurationError(
                f"CONSOLE_USERS: {name!r} has the role {match['role']!r}; roles are admin and viewer."
            )
        if name in found:
            raise ConfigurationError(f"CONSOLE_USERS names {name!r} twice.")
        found[name] = ConsoleUser(name, Role(match["role"]), match["hash"])
    return found


def _entries(raw: str) -> list[str]:
    entries: list[str] = []
    for part in raw.split(","):
        if entries and not _ENTRY_START.match(part):
            entries[-1] += "," + part
        elif part.strip():
            entries.append(part.strip())
    return entries


def check_console(settings: ConsoleSettings) -> None:
    """Parse CONSOLE_USERS and check CONSOLE_SECRET; raise :class:`ConfigurationError` for the first fault."""
    users(settings)
    if settings.console_secret and len(settings.console_secret) < MIN_CONSOLE_SECRET_CHARS:
        raise ConfigurationError(
            f"CONSOLE_SECRET must be at least {MIN_CONSOLE_SECRET_CHARS} characters (a random string: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))')."
        )
