"""The SMTP mailer replaces a connection the provider dropped, sends content as written, and logs in.

That a refusal keeps the connection for the next message is in tests/integration/test_smtp_replies.py,
which counts the connections.
"""

from __future__ import annotations

import email.policy
from email.message import EmailMessage

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from reports.delivery.mail import smtp
from reports.delivery.mail.smtp import SmtpMailer
from reports.errors import ProviderUnavailable
from tests.support.processes import free_port
from tests.support.smtp import RecordingHandler


def _message(to: str) -> bytes:
    message = EmailMessage()
    message["From"] = "reports@reports.test"
    message["To"] = to
    message["Subject"] = "report"
    message.set_content("hello")
    return message.as_bytes()


def test_a_connection_the_provider_dropped_is_replaced_before_the_next_message(smtp_server, monkeypatch):
    monkeypatch.setattr(smtp, "CHECK_IDLE_AFTER_SECONDS", 0.0)  # every kept connection is checked
    mailer = SmtpMailer(smtp_server.url, timeout_seconds=5, sender="reports@reports.test")
    mailer.send(_message("a@example.test"), recipient="a@example.test")
    smtp_server.stop()
    smtp_server.start()
    mailer.send(_message("b@example.test"), recipient="b@example.test")
    assert [m["To"] for m in smtp_server.messages] == ["a@example.test", "b@example.test"]


def test_lines_that_start_with_a_dot_arrive_as_written(smtp_server):
    # SMTP ends the content at a line holding only "."; the client doubles every leading dot and
    # the server takes one off, so what arrives is what was sent.
    mailer = SmtpMailer(smtp_server.url, timeout_seconds=5, sender="reports@reports.test")
    body = ".\n..\n.starts with a dot\nmiddle . dot\n.\n"
    message = EmailMessage()
    message["To"] = "a@example.test"
    message.set_content(body, cte="7bit")
    mailer.send(message.as_bytes(policy=email.policy.SMTP), recipient="a@example.test")  # CRLF, as composed
    mailer.send(_message("b@example.test"), recipient="b@example.test")
    first, second = smtp_server.messages
    assert first.get_content().replace("\r\n", "\n") == body
    assert second["To"] == "b@example.test"


class _Logins:
    """An aiosmtpd authenticator that takes one user name and password, and counts the logins."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password, self.logins = user.encode(), password.encode(), 0

    def __call__(self, _server, _session, _envelope, _mechanism, data) -> AuthResult:  # type: ignore[no-untyped-def]
        good = isinstance(data, LoginPassword) and (data.login, data.password) == (self.user, self.password)
        self.logins += good
        return AuthResult(success=good)


def test_a_relay_on_this_machine_takes_a_login_without_tls():
    # smtp://user:pass@127.0.0.1:port: the credentials never leave the machine.
    logins = _Logins("reports", "s3cret")
    handler = RecordingHandler()
    port = free_port()
    controller = Controller(
        handler,
        hostname="127.0.0.1",
        port=port,
        authenticator=logins,
        auth_require_tls=False,
    )
    controller.start()
    try:
        mailer = SmtpMailer(f"smtp://reports:s3cret@127.0.0.1:{port}", timeout_seconds=5, sender="reports@reports.test")
        mailer.send(_message("a@example.test"), recipient="a@example.test")
        wrong = SmtpMailer(f"smtp://reports:wrong@127.0.0.1:{port}", timeout_seconds=5, sender="reports@reports.test")
        with pytest.raises(ProviderUnavailable):
            wrong.send(_message("b@example.test"), recipient="b@example.test")
    finally:
        controller.stop()
    assert logins.logins == 1
    assert [message["To"] for _, message in handler.messages] == ["a@example.test"]
