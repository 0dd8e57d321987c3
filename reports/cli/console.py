"""``reports console hash-password``: an Argon2 hash for a CONSOLE_USERS entry."""

from __future__ import annotations

import sys

import click

from reports.cli.app import cli, is_utf8
from reports.console.passwords import hash_password
from reports.errors import BadInput

#: Shortest password hashed, in characters.
MIN_PASSWORD_CHARS = 12

#: Longest password hashed, in characters: Argon2 takes any length, a form field does not need more.
MAX_PASSWORD_CHARS = 1024


@cli.group()
def console() -> None:
    """The operator console at /console/ on the web process."""


@console.command("hash-password")
def hash_password_command() -> None:
    """Print an Argon2 hash for CONSOLE_USERS (name:role:HASH).

    From a terminal, asks for the password twice; otherwise reads one password per line of
    standard input and prints one hash per line, in order.
    """
    if sys.stdin.isatty():
        passwords = [click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)]
    else:
        passwords = [line.rstrip("\r\n") for line in sys.stdin]
    if not passwords:
        raise BadInput("No password on standard input (one per line).")
    for number, password in enumerate(passwords, start=1):
        where = f" on line {number}" if len(passwords) > 1 else ""
        if not MIN_PASSWORD_CHARS <= len(password) <= MAX_PASSWORD_CHARS:
            raise BadInput(f"The password{where} must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters long.")
        if not is_utf8(password):
            raise BadInput(f"The password{where} is not UTF-8 text.")
    for password in passwords:
        click.echo(hash_password(password))
