"""Send through an SMTP provider, translating its replies into permanent and transient errors."""

from __future__ import annotations

import smtplib
import ssl
import threading
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from urllib.parse import parse_qs, unquote, urlsplit

from reports.errors import ConfigurationError, MailDeferred, MailRejected, ProviderUnavailable
from reports.settings import redact_url

_TRUE = {"1", "true", "yes", "on"}

#: A kept connection unused for this long is checked with NOOP before the next message.
CHECK_IDLE_AFTER_SECONDS = 5.0


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
    """Sends over one SMTP connection per worker thread, kept open between messages.

    Reuse saves a TCP and TLS handshake per email, and keeps QUIT out of the window between the
    provider's ``250`` and the database recording the send: the narrower that window, the
    rarer the duplicate a crash inside it can cause.
    """

    def __init__(self, url: str, *, timeout_seconds: float) -> None:
        self.target = SmtpTarget.from_url(url)
        self.timeout_seconds = timeout_seconds
        self._local = threading.local()

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

    def _client(self) -> smtplib.SMTP:
        client: smtplib.SMTP | None = getattr(self._local, "client", None)
        if client is not None and time.monotonic() - self._local.last_used > CHECK_IDLE_AFTER_SECONDS:
            # Providers drop idle connections; find out now, before a message is on the wire.
            try:
                client.noop()
            except (smtplib.SMTPException, OSError):
                self._drop()
                client = None
        if client is None:
            client = self._local.client = self._connect()
            self._local.last_used = time.monotonic()
        return client

    def _drop(self) -> None:
        client = getattr(self._local, "client", None)
        self._local.client = None
        if client is not None:
            client.close()

    def send(self, message: EmailMessage, *, recipient: str) -> None:
        try:
            client = self._client()
        except (smtplib.SMTPException, OSError) as e:
            # Whatever fails before a message is on the wire (greeting, TLS, login) is the
            # provider's trouble, not this message's, even a 5xx greeting.
            raise ProviderUnavailable(f"SMTP provider unreachable: {type(e).__name__}: {e}") from None
        try:
            try:
                client.send_message(message, to_addrs=[recipient])
            except (smtplib.SMTPRecipientsRefused, smtplib.SMTPResponseException):
                # The provider answered; the connection is fine once the transaction is reset.
                try:
                    client.rset()
                    self._local.last_used = time.monotonic()
                except (smtplib.SMTPException, OSError):
                    self._drop()
                raise
            except (smtplib.SMTPException, OSError):
                self._drop()
                raise
            self._local.last_used = time.monotonic()
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
