"""Write mail to a Maildir outbox: the embedded default when no SMTP provider is configured."""

from __future__ import annotations

import mailbox
from pathlib import Path


class MaildirMailer:
    def __init__(self, path: Path) -> None:
        for sub in ("tmp", "new", "cur"):
            (path / sub).mkdir(parents=True, exist_ok=True)
        # Maildir delivers through tmp/ and an atomic rename: safe across worker processes.
        self.maildir = mailbox.Maildir(path, create=False)

    def send(self, message: bytes, *, recipient: str) -> None:
        self.maildir.add(message)
