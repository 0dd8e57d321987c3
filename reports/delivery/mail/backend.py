"""Choose the mail backend the settings ask for."""

from __future__ import annotations

from typing import Protocol

from reports.delivery.mail.maildir import MaildirMailer
from reports.delivery.mail.smtp import SmtpMailer
from reports.endpoints import SmtpTarget
from reports.sender import parse_sender
from reports.settings import Settings


class Mailer(Protocol):
    def send(self, message: bytes, *, recipient: str) -> None:
        """Hand over one message, as it goes on the wire, for ``recipient``."""


def build_mailer(settings: Settings) -> Mailer:
    if settings.smtp_url:
        return SmtpMailer(
            settings.smtp_url,
            timeout_seconds=settings.smtp_timeout_seconds,
            sender=parse_sender(settings.mail_from).address,
            helo_name=settings.helo_name,
        )
    return MaildirMailer(settings.outbox_dir)


def destination(settings: Settings) -> str:
    """Where :func:`build_mailer`'s mail goes, in words for an operator: no credentials."""
    if settings.smtp_url:
        target = SmtpTarget.from_url(settings.smtp_url)
        return f"the SMTP server {target.host}:{target.port} (SMTP_URL)"
    return f"the Maildir outbox {settings.outbox_dir.resolve() / 'new'} (SMTP_URL is unset)"
