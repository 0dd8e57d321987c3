"""Send through an SMTP provider, translating its replies into permanent and transient errors."""

from __future__ import annotations

import contextlib
import enum
import math
import re
import smtplib
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from reports.delivery.mail import replies
from reports.endpoints import SmtpTarget
from reports.errors import (
    SERVICE_NOT_AVAILABLE,
    MailDeferred,
    MailRejected,
    ProviderUnavailable,
    RateLimited,
    SendUnconfirmed,
)

#: A kept connection unused for this long is checked with NOOP before the next message.
CHECK_IDLE_AFTER_SECONDS = 5.0

#: An ASCII dot-atom address (RFC 5322): smtplib's ``quoteaddr`` gives it back as ``<address>``.
#: Its parser cost two tenths of a millisecond per address (MAIL FROM and RCPT TO each message),
#: so such an address skips it; any other goes through it as before.
_DOT_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_PLAIN_ADDRESS = re.compile(rf"{_DOT_ATOM}@{_DOT_ATOM}")


def envelope_address(address: str) -> str:
    """``address`` as MAIL FROM and RCPT TO carry it: what ``smtplib.quoteaddr`` makes of it."""
    return f"<{address}>" if _PLAIN_ADDRESS.fullmatch(address) else smtplib.quoteaddr(address)


class _Stage(enum.Enum):
    """Where in the transaction a reply came: what a refusal there says about the message."""

    MAIL = "MAIL FROM"
    RCPT = "RCPT TO"
    DATA = "DATA"
    #: The reply to the message's content, after the final ".".
    CONTENT = "content"


#: Replies that say the session is in a wrong state (a command out of sequence, one the server
#: could not parse), not that this message is bad: a provider that answered 421 and kept the
#: connection open, for instance, then answers "503 send HELO first" to every message.
_SESSION_CODES = frozenset({500, 501, 503})

#: A character of an address in a provider's reply: anything but what quotes or ends one (the
#: local part's, an ``@`` too).
_IN_ADDRESS = r"[^\s<>()\[\]\\,;:\"']"
_IN_LOCAL_PART = r"[^\s<>()\[\]\\,;:\"'@]"
#: A quoted local part (``"jane doe"@…``) and a domain literal (``…@[192.0.2.7]``), as RFC 5321
#: allows; bounded, so that a stray quote or bracket costs a short look ahead, not the whole reply.
_QUOTED_LOCAL_PART = r'"[^"\r\n]{0,64}"'
_DOMAIN_LITERAL = r"\[[^\]\s]{1,64}\]"
#: Addresses in a provider's reply (``550 5.1.1 <x@y>: Recipient address rejected``), with their
#: angle brackets if they have them: personal data, kept out of errors, dead letters and logs.
#: A local part may hold apostrophes (``mary.o'brien@…``, which a dot-atom allows); those before
#: it quote the address (``'x@y'``) and are kept, as ``quote``. A match starts only where a word
#: does, and its local part is never read twice, so a long reply costs one pass.
_ADDRESS_IN_REPLY = re.compile(
    rf"(?<!{_IN_LOCAL_PART})(?<!')(?P<quote>'*)<?"
    rf"(?>{_QUOTED_LOCAL_PART}|{_IN_LOCAL_PART}+(?:'+{_IN_LOCAL_PART}+)*'*)"
    rf"@(?:{_DOMAIN_LITERAL}|{_IN_ADDRESS}+)>?"
)


class _Refused(Exception):
    def __init__(self, stage: _Stage, code: int, reply: bytes | str) -> None:
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        self.stage, self.code, self.reply = stage, code, _ADDRESS_IN_REPLY.sub(r"\g<quote><address>", text)
        super().__init__(stage.value, code, self.reply)

    @property
    def breaks_session(self) -> bool:
        """Whether the connection, not the message, is at fault: reconnect and try again."""
        if self.code in _SESSION_CODES:
            # But a 501 to RCPT TO whose enhanced code names the address (5.1.3: a recipient
            # address the provider cannot read) refuses this address, every time it is tried.
            return not (
                self.stage is _Stage.RCPT
                and replies.enhanced_code(self.reply) is not None
                and replies.is_about_address(self.code, self.reply, to_recipient=True)
            )
        if not 400 <= self.code < 600:
            return True
        # Only a 5xx to RCPT TO, or to the content of a well-formed transaction, is about the message.
        return self.code >= 500 and self.stage in (_Stage.MAIL, _Stage.DATA)

    @property
    def ends_session(self) -> bool:
        """Whether the connection is done with: a ``421`` closes it (RFC 5321), whatever the
        server then does, and a broken session is not worth resetting."""
        return self.code == SERVICE_NOT_AVAILABLE or self.breaks_session

    def error(self, recipient: str) -> MailRejected | MailDeferred | ProviderUnavailable | RateLimited:
        """The refusal as the pipeline takes it, read from the whole reply; its text with
        ``recipient``'s local part masked too, where the reply names it without its domain
        (``jane.doe... User unknown``), which the address's own mask cannot see."""
        shown = _without_local_part(self.reply, recipient)
        if replies.is_about_rate(self.code, self.reply):
            return RateLimited(self.code, shown)
        if self.code == SERVICE_NOT_AVAILABLE:
            return MailDeferred(self.code, shown)
        if self.breaks_session:
            return ProviderUnavailable(f"SMTP session broken: {self.code} to {self.stage.value}: {shown}")
        if self.code >= 500:
            to_recipient = self.stage is _Stage.RCPT
            about_address = replies.is_about_address(self.code, self.reply, to_recipient=to_recipient)
            return MailRejected(self.code, shown, recipient=to_recipient and about_address, about_address=about_address)
        return MailDeferred(self.code, shown)


#: Shorter local parts are left in a reply: masked, ``jo`` would take out every word "jo" too, and
#: without its domain it names nobody.
_LOCAL_PART_MASKED_FROM = 3


def _without_local_part(reply: str, recipient: str) -> str:
    local = recipient.rpartition("@")[0]
    if len(local) < _LOCAL_PART_MASKED_FROM:
        return reply
    # As a word of its own: not inside a longer name, but followed by "..." as sendmail writes it.
    alone = rf"(?<![\w.+'-]){re.escape(local)}(?![\w+'-]|\.\w)"
    return re.sub(alone, "<address>", reply, flags=re.IGNORECASE)


class _DeadlineReader:
    """Reads the server's replies with whatever is left of the send's deadline, per read.

    A socket timeout alone bounds each read, so a slow provider trickling bytes could stretch
    one send past the claim's lease; here every read gets only the time that remains.
    """

    def __init__(self, client: _DeadlineSMTP) -> None:
        assert client.sock is not None
        self.sock = client.sock
        self._client = client
        self._buffer = b""

    def readline(self, limit: int = -1) -> bytes:
        while b"\n" not in self._buffer and (limit < 0 or len(self._buffer) < limit):
            self._client.arm()
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self._buffer += chunk
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        if limit >= 0:
            end = min(end, limit)
        line, self._buffer = self._buffer[:end], self._buffer[end:]
        return line

    def close(self) -> None:
        self._buffer = b""


class _DeadlineSMTP(smtplib.SMTP):
    """An SMTP client whose every command and reply shares one deadline (``time.monotonic``)."""

    deadline: float = math.inf

    def arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("The send's deadline passed.")
        if self.sock is not None:
            self.sock.settimeout(left)

    #: Commands held back by :meth:`pipelined`, to go out in one write.
    _held: list[bytes] | None = None

    def send(self, s: Any) -> None:
        if self._held is not None:
            self._held.append(s.encode(self.command_encoding) if isinstance(s, str) else s)
            return
        self.arm()
        super().send(s)

    @contextlib.contextmanager
    def pipelined(self) -> Iterator[None]:
        """Commands given inside go out together in one write when it ends (RFC 2920): their
        replies are then read in order, one round trip for all of them instead of one each."""
        self._held = []
        try:
            yield
            held = b"".join(self._held)
        finally:
            self._held = None
        self.send(held)

    def getreply(self) -> tuple[int, bytes]:
        if self.sock is not None and (self.file is None or getattr(self.file, "sock", None) is not self.sock):
            self.file = _DeadlineReader(self)
        return super().getreply()

    def mail(self, sender: str, options: Sequence[str] = ()) -> tuple[int, bytes]:
        """smtplib's MAIL FROM, with :func:`envelope_address` (no options are sent here)."""
        if options:
            return super().mail(sender, options)
        self.put_mail(sender)
        return self.getreply()

    def rcpt(self, recip: str, options: Sequence[str] = ()) -> tuple[int, bytes]:
        """smtplib's RCPT TO, with :func:`envelope_address`."""
        if options:
            return super().rcpt(recip, options)
        self.put_rcpt(recip)
        return self.getreply()

    def put_mail(self, sender: str) -> None:
        self.putcmd("mail", f"from:{envelope_address(sender)}")

    def put_rcpt(self, recipient: str) -> None:
        self.putcmd("rcpt", f"to:{envelope_address(recipient)}")

    def content(self, msg: bytes) -> tuple[int, bytes]:
        """The message after DATA's ``354``, and the reply to it. smtplib's ``data`` dot-stuffs
        with a multiline regular expression over the whole message, which cost half as much as
        encoding the report's HTML; one ``bytes.replace`` doubles the same dots (every "." that
        starts the message or follows a "\\n")."""
        stuffed = (b"." if msg.startswith(b".") else b"") + msg.replace(b"\n.", b"\n..")
        self.send(stuffed + (b".\r\n" if stuffed.endswith(b"\r\n") else b"\r\n.\r\n"))
        return self.getreply()


class _DeadlineSMTPSSL(_DeadlineSMTP, smtplib.SMTP_SSL):
    pass


class SmtpMailer:
    """Sends over one SMTP connection per worker thread, kept open between messages.

    Reuse saves a TCP and TLS handshake per email, and keeps QUIT out of the window between the
    provider's ``250`` and the database recording the send: the narrower that window, the
    rarer the duplicate a crash inside it can cause. One send, connection included, never takes
    longer than ``timeout_seconds``, so it cannot outlive the claim's lease. To a provider that
    offers PIPELINING, a message's envelope goes in one write: two round trips a message, not four.
    """

    def __init__(self, url: str, *, timeout_seconds: float, sender: str, helo_name: str | None = None) -> None:
        self.target = SmtpTarget.from_url(url)
        self.timeout_seconds = timeout_seconds
        #: The envelope sender (MAIL FROM).
        self.sender = sender
        #: The name given in EHLO; ``None``: smtplib's (the host's FQDN, or an address literal).
        self.helo_name = helo_name
        self._local = threading.local()

    def _connect(self, deadline: float) -> _DeadlineSMTP:
        target = self.target
        client: _DeadlineSMTP
        client = (
            _DeadlineSMTPSSL(context=ssl.create_default_context(), local_hostname=self.helo_name)
            if target.implicit_tls
            else _DeadlineSMTP(local_hostname=self.helo_name)
        )
        client.deadline = deadline
        client.timeout = max(deadline - time.monotonic(), 0.001)
        client.connect(target.host, target.port)
        if target.starttls:
            client.starttls(context=ssl.create_default_context())
        if target.username:
            client.login(target.username, target.password or "")
        return client

    def _client(self, deadline: float) -> _DeadlineSMTP:
        client: _DeadlineSMTP | None = getattr(self._local, "client", None)
        if client is not None:
            client.deadline = deadline
            if time.monotonic() - self._local.last_used > CHECK_IDLE_AFTER_SECONDS and not self._alive(client):
                client = None
        if client is None:
            try:
                client = self._local.client = self._connect(deadline)
            except (smtplib.SMTPException, OSError) as e:
                # Whatever fails before a message is on the wire (greeting, TLS, login) is the
                # provider's trouble, not this message's, even a 5xx greeting.
                raise _unavailable(e) from None
        return client

    def _alive(self, client: _DeadlineSMTP) -> bool:
        """Providers drop idle connections, or answer 421 and keep them: find out before a message."""
        try:
            if client.noop()[0] == 250:
                return True
        except (smtplib.SMTPException, OSError):
            pass
        self._drop()
        return False

    def _drop(self) -> None:
        client = getattr(self._local, "client", None)
        self._local.client = None
        if client is not None:
            client.close()

    def send(self, message: bytes, *, recipient: str) -> None:
        deadline = time.monotonic() + self.timeout_seconds
        # A session the provider broke (before the content was accepted or refused) is replaced
        # and the message tried once more on the new one, within the same deadline: once it has
        # passed, no new connection is opened only to give up at its greeting.
        for last_try in (False, True):
            client = self._client(deadline)
            stage: list[_Stage] = []
            try:
                _transaction(client, self.sender, recipient, message, stage)
                self._local.last_used = time.monotonic()
                return
            except _Refused as refused:
                self._after_refusal(client, refused)
                if refused.stage is _Stage.CONTENT and not 400 <= refused.code < 600:
                    # Neither a 250 nor a refusal (no code, a 2xx or 3xx): the provider may have
                    # taken the message, so, as with no reply at all, only a later attempt after
                    # the claim's lease may send it again.
                    raise SendUnconfirmed(f"SMTP provider gave the message no clear reply: {refused.code}") from None
                if not refused.breaks_session or refused.code == SERVICE_NOT_AVAILABLE or last_try or _passed(deadline):
                    raise refused.error(recipient) from None
            except (smtplib.SMTPException, OSError) as e:
                self._drop()
                # Once the content is on the wire its fate is unknown: only a later attempt,
                # after the claim's lease, may send it again.
                if stage[-1:] == [_Stage.CONTENT]:
                    raise SendUnconfirmed(f"SMTP provider did not answer the message: {_failure(e)}") from None
                if last_try or _passed(deadline):
                    raise _unavailable(e) from None

    def _after_refusal(self, client: _DeadlineSMTP, refused: _Refused) -> None:
        if refused.ends_session or client.sock is None:  # None: left in an unknown state, closed
            self._drop()
            return
        try:
            client.rset()  # the provider answered: the connection is fine once the transaction is reset
            self._local.last_used = time.monotonic()
        except (smtplib.SMTPException, OSError):
            self._drop()


def _timed_out(error: BaseException) -> bool:
    """Whether the provider did not answer in time. smtplib reports a reply that came too late as
    the connection "unexpectedly closed" (``SMTPServerDisconnected``), the timeout behind it."""
    if isinstance(error, smtplib.SMTPServerDisconnected):
        return isinstance(error.__context__, TimeoutError)
    return isinstance(error, TimeoutError)


def _failure(error: BaseException) -> str:
    return TimeoutError.__name__ if _timed_out(error) else type(error).__name__


def _unavailable(error: BaseException) -> ProviderUnavailable:
    if _timed_out(error):
        return ProviderUnavailable(f"SMTP provider did not answer in time: {TimeoutError.__name__}")
    return ProviderUnavailable(f"SMTP provider unreachable: {type(error).__name__}")


def _passed(deadline: float) -> bool:
    return time.monotonic() >= deadline


def _transaction(client: _DeadlineSMTP, sender: str, recipient: str, data: bytes, stage: list[_Stage]) -> None:
    """One mail transaction, each reply checked at its stage; ``stage`` records how far it got."""
    client.ehlo_or_helo_if_needed()
    if client.has_extn("pipelining"):
        _pipelined_envelope(client, sender, recipient, stage)
    else:
        _envelope(client, sender, recipient, stage)
    stage.append(_Stage.CONTENT)
    code, reply = client.content(data)
    if code != 250:
        raise _Refused(_Stage.CONTENT, code, reply)


#: The replies each envelope command must get for the transaction to go on, in the commands' order.
_ACCEPTED = {_Stage.MAIL: (250,), _Stage.RCPT: (250, 251), _Stage.DATA: (354,)}


def _check(command: _Stage, code: int, reply: bytes) -> None:
    if code not in _ACCEPTED[command]:
        raise _Refused(command, code, reply)


def _envelope(client: _DeadlineSMTP, sender: str, recipient: str, stage: list[_Stage]) -> None:
    """MAIL FROM, RCPT TO and DATA, each sent once the one before it was accepted."""
    stage.append(_Stage.MAIL)
    _check(_Stage.MAIL, *client.mail(sender))
    stage.append(_Stage.RCPT)
    _check(_Stage.RCPT, *client.rcpt(recipient))
    stage.append(_Stage.DATA)
    _check(_Stage.DATA, *client.docmd("data"))


def _pipelined_envelope(client: _DeadlineSMTP, sender: str, recipient: str, stage: list[_Stage]) -> None:
    """MAIL FROM, RCPT TO and DATA in one write, to a provider that offers PIPELINING.

    The first refused reply is the transaction's fate, as it would be one command at a time. The
    replies after it (a ``503`` or ``554``: no valid sender or recipient) are read before the
    transaction is reset on the same connection; a session the refusal broke is dropped unread.
    """
    with client.pipelined():
        client.put_mail(sender)
        client.put_rcpt(recipient)
        client.putcmd("data")
    commands = list(_ACCEPTED)
    for index, command in enumerate(commands):
        stage.append(command)
        try:
            _check(command, *client.getreply())
        except _Refused as refused:
            if not refused.ends_session:
                _read_unanswered(client, len(commands) - index - 1)
            raise


def _read_unanswered(client: _DeadlineSMTP, replies_left: int) -> None:
    """Read the replies to the commands after a refused one, so the next command's reply is its
    own. A provider that accepts DATA all the same (RFC 2920 says it must not) or does not
    answer leaves the session unknown: it is closed, and the next message opens another."""
    try:
        for _ in range(replies_left):
            if client.getreply()[0] == 354:
                client.close()
                return
    except (smtplib.SMTPException, OSError):
        client.close()
