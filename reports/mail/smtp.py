"""Send through an SMTP provider, translating its replies into permanent and transient errors."""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass, field
from email.message import EmailMessage
from urllib.parse import parse_qs, unquote, urlsplit

from reports.errors import ConfigurationError, MailDeferred, MailRejected, ProviderUnavailable
from reports.settings import redact_url

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    implicit_tls: bool
    starttls: bool
    username: str | None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_url(cls, url: str) -> SmtpTarget:
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ConfigurationError(f"SMTP_URL must be smtp://host:port or smtps://host:port, got {redact_url(url)}.")
        implicit_tls = parts.scheme == "smtps"
        query = parse_qs(parts.query)
        try:
            port = parts.port or (465 if implicit_tls else 25)
        except ValueError:
            raise ConfigurationError(f"SMTP_URL has an invalid port: {redact_url(url)}.") from None
        return cls(
            host=parts.hostname,
            port=port,
            implicit_tls=implicit_tls,
            starttls=query.get("starttls", ["false"])[0].lower() in _TRUE,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )


class SmtpMailer:
    """One connection per send: simple, and a broken connection never outlives its message."""

    def __init__(self, url: str, *, timeout_seconds: float) -> None:
        self.target = SmtpTarget.from_url(url)
        self.timeout_seconds = timeout_seconds

    def _connect(self) -> smtplib.SMTP:
        target = self.target
        if target.implicit_tls:
            client: smtplib.SMTP = smtplib.SMTP_SSL(
                target.host, target.port, timeout=self.timeout_seconds, context=ssl.create_default_context()
            )
        else:
            client = smtplib.SMTP(target.host, target.port, timeout=self.timeout_seconds)
        if target.starttls:
            client.starttls(context=ssl.create_default_context())
        if target.username:
            client.login(target.username, target.password or "")
        return client

    def send(self, message: EmailMessage, *, recipient: str) -> None:
        try:
            client = self._connect()
            try:
                client.send_message(message, to_addrs=[recipient])
            finally:
                try:
                    client.quit()
                except (smtplib.SMTPException, OSError):
                    client.close()
        except smtplib.SMTPRecipientsRefused as e:
            code, reply = next(iter(e.recipients.values()))
            raise _reply_error(code, reply) from None
        except smtplib.SMTPResponseException as e:
            raise _reply_error(e.smtp_code, e.smtp_error) from None
        except (smtplib.SMTPException, OSError) as e:
            raise ProviderUnavailable(f"SMTP provider unreachable: {type(e).__name__}: {e}") from None


def _reply_error(code: int, reply: bytes | str) -> MailRejected | MailDeferred:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    if 500 <= code < 600:
        return MailRejected(code, text)
    return MailDeferred(code, text)
