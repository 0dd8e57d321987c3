"""How the SMTP mailer reads a real provider's replies: who is at fault, and what it does next.

A scripted aiosmtpd server answers chosen commands with chosen replies (including the ones a
handler hook cannot give, such as a reply to the DATA command itself), and counts connections,
so each test can tell a reconnect from a kept connection. Every test runs against a provider
that offers PIPELINING and one that does not.
"""

from __future__ import annotations

import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP

from reports.delivery.mail.smtp import SmtpMailer
from reports.errors import MailDeferred, MailRejected, ProviderUnavailable, RateLimited, SendUnconfirmed
from tests.support.processes import free_port
from tests.support.smtp import LoopbackServer, RecordingHandler

SENDER = "reports@reports.test"


@dataclass
class Script:
    """Replies the provider gives instead of its own, per command, in order; and its connections."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The client ends (host, port) of the connections that greeted the server: one per connection
    #: a client used (the controller's own start-up check connects but never greets).
    greeted: set[tuple[str, int]] = field(default_factory=set)
    #: command ("MAIL", "RCPT", "DATA") -> replies still to give, one per time the command comes.
    replies: dict[str, list[str]] = field(default_factory=dict)
    #: command -> the reply it gets every time.
    always: dict[str, str] = field(default_factory=dict)

    def reply_to(self, command: str) -> str | None:
        with self.lock:
            if command in self.always:
                return self.always[command]
            queued = self.replies.get(command)
            return queued.pop(0) if queued else None


class ScriptedSMTP(SMTP):
    """An aiosmtpd session that gives the script's replies; a ``421`` keeps the connection open
    but forgets the session, as some providers do: every later command then gets
    ``503 5.5.1 Error: send HELO first``."""

    def __init__(self, handler: RecordingHandler, script: Script, **kwargs: object) -> None:
        super().__init__(handler, **kwargs)  # type: ignore[arg-type]
        self.script = script

    async def smtp_EHLO(self, hostname: str) -> None:
        assert self.session is not None
        with self.script.lock:
            self.script.greeted.add(self.session.peer)
        await super().smtp_EHLO(hostname)

    async def smtp_HELO(self, hostname: str) -> None:
        assert self.session is not None
        with self.script.lock:
            self.script.greeted.add(self.session.peer)
        await super().smtp_HELO(hostname)

    async def _scripted(self, command: str) -> bool:
        reply = self.script.reply_to(command)
        if reply is None:
            return False
        if reply.startswith("421"):
            assert self.session is not None
            self.session.host_name = None
            self._set_rset_state()
        await self.push(reply)
        return True

    async def smtp_MAIL(self, arg: str | None) -> None:
        if not await self._scripted("MAIL"):
            await super().smtp_MAIL(arg)

    async def smtp_RCPT(self, arg: str | None) -> None:
        if not await self._scripted("RCPT"):
            await super().smtp_RCPT(arg)

    async def smtp_DATA(self, arg: str) -> None:
        if not await self._scripted("DATA"):
            await super().smtp_DATA(arg)


class ScriptedController(Controller):
    def __init__(self, handler: RecordingHandler, script: Script, port: int) -> None:
        super().__init__(handler, hostname="127.0.0.1", port=port)
        self.script = script

    def factory(self) -> ScriptedSMTP:
        return ScriptedSMTP(self.handler, self.script, **self.SMTP_kwargs)


@dataclass
class Provider:
    url: str
    handler: RecordingHandler
    script: Script

    @property
    def connections(self) -> int:
        with self.script.lock:
            return len(self.script.greeted)

    def delivered_to(self) -> list[str]:
        with self.handler.lock:
            return [recipient for recipients, _ in self.handler.messages for recipient in recipients]


@pytest.fixture(params=[True, False], ids=["pipelining", "one-command-at-a-time"])
def provider(request: pytest.FixtureRequest) -> Iterator[Provider]:
    """A provider that offers PIPELINING (the envelope's three commands come in one write) or not."""
    handler, script = RecordingHandler(), Script()
    handler.pipelining = request.param
    port = free_port()
    controller = ScriptedController(handler, script, port)
    controller.start()
    try:
        yield Provider(url=f"smtp://127.0.0.1:{port}", handler=handler, script=script)
    finally:
        controller.stop()


def message(to: str) -> bytes:
    built = EmailMessage()
    built["From"] = f"Monthly Reports <{SENDER}>"
    built["To"] = to
    built["Subject"] = "Your report"
    built.set_content("hello")
    return built.as_bytes()


def send(mailer: SmtpMailer, to: str) -> None:
    mailer.send(message(to), recipient=to)


FORGOTTEN = "503 5.5.1 Error: send HELO first"


# --- 421: the provider closes the session, whether or not it closes the connection ------------


@pytest.mark.parametrize("command", ["RCPT", "DATA"])
def test_a_421_that_leaves_the_connection_open_is_deferred_and_the_next_send_uses_a_new_connection(
    provider: Provider, command: str
) -> None:
    provider.script.replies[command] = ["421 4.3.2 Service shutting down, try again later"]
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(MailDeferred) as deferred:
        send(mailer, "first@example.test")
    assert deferred.value.code == 421
    assert provider.connections == 1

    send(mailer, "second@example.test")

    assert provider.delivered_to() == ["second@example.test"]
    assert provider.connections == 2, "the next message went over the connection the provider had given up"


def test_a_provider_that_forgot_the_session_on_a_kept_connection_still_gets_the_next_message(
    provider: Provider,
) -> None:
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)
    send(mailer, "first@example.test")
    # The provider now forgets the session without closing the connection (an unsolicited 421).
    provider.script.replies["MAIL"] = [FORGOTTEN]

    send(mailer, "second@example.test")

    assert provider.delivered_to() == ["first@example.test", "second@example.test"]
    assert provider.connections == 2


# --- 500/501/503: the session is broken, not the message --------------------------------------


@pytest.mark.parametrize("code", [500, 501, 503])
@pytest.mark.parametrize("command", ["MAIL", "RCPT", "DATA"])
def test_a_session_error_to_a_command_is_retried_once_on_a_new_connection_and_the_message_delivered(
    provider: Provider, command: str, code: int
) -> None:
    provider.script.replies[command] = [f"{code} 5.5.1 Error: command out of sequence"]
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    send(mailer, "user@example.test")  # neither MailRejected nor anything else

    assert provider.delivered_to() == ["user@example.test"]
    assert provider.connections == 2


@pytest.mark.parametrize("command", ["MAIL", "RCPT", "DATA"])
def test_a_session_error_on_both_tries_is_a_transient_provider_failure_never_a_rejection(
    provider: Provider, command: str
) -> None:
    provider.script.always[command] = FORGOTTEN
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(ProviderUnavailable) as failure:
        send(mailer, "user@example.test")

    assert not isinstance(failure.value, MailRejected)
    assert not isinstance(failure.value, SendUnconfirmed), "nothing of the message was on the wire"
    assert provider.delivered_to() == []
    assert provider.connections == 2, "one reconnect and one more try, no more"


# --- No reply to the content: the provider may have the message ------------------------------


def test_a_message_the_provider_kept_without_answering_in_time_is_unconfirmed_and_not_tried_again(
    provider: Provider,
) -> None:
    provider.handler.answer_delay_seconds = 3
    mailer = SmtpMailer(provider.url, timeout_seconds=1, sender=SENDER)

    with pytest.raises(SendUnconfirmed) as unconfirmed:
        send(mailer, "user@example.test")

    # smtplib calls the late reply a closed connection; the timeout is what the logs say.
    assert str(unconfirmed.value) == "SMTP provider did not answer the message: TimeoutError"
    assert provider.delivered_to() == ["user@example.test"]
    assert provider.connections == 1, "a message on the wire is never tried again on a new connection"


@pytest.mark.parametrize("reply", ["OK queued as 12345", "354 go ahead", "220 ready"], ids=["no-code", "354", "220"])
def test_a_reply_to_the_message_that_neither_accepts_nor_refuses_it_is_unconfirmed_and_not_sent_again(
    provider: Provider, reply: str
) -> None:
    # The provider may have taken the message: only a 4xx or 5xx says it did not.
    provider.handler.fault = lambda rcpt, attempt: reply if attempt == 1 else None
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(SendUnconfirmed):
        send(mailer, "user@example.test")

    assert provider.handler.attempts == {"user@example.test": 1}, "the message sent again"


# --- 5xx about the message: permanent, and the connection is fine ------------------------------


def test_a_550_to_the_recipient_rejects_the_message_and_the_next_one_goes_over_the_same_connection(
    provider: Provider,
) -> None:
    provider.script.replies["RCPT"] = ["550 5.1.1 No such user"]
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(MailRejected) as rejected:
        send(mailer, "gone@example.test")
    assert rejected.value.code == 550

    send(mailer, "next@example.test")

    assert provider.delivered_to() == ["next@example.test"]
    assert provider.connections == 1


def test_a_554_to_the_content_rejects_the_message_and_the_next_one_goes_over_the_same_connection(
    provider: Provider,
) -> None:
    provider.handler.fault = lambda rcpt, attempt: (
        "554 5.6.0 Message content rejected" if rcpt.startswith("spam") else None
    )
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(MailRejected) as rejected:
        send(mailer, "spam@example.test")
    assert rejected.value.code == 554

    send(mailer, "next@example.test")

    assert provider.delivered_to() == ["next@example.test"]
    assert provider.handler.attempts == {"spam@example.test": 1, "next@example.test": 1}, "content sent twice"
    assert provider.connections == 1


def test_a_550_to_mail_from_is_the_providers_trouble_not_a_rejection_of_the_message(provider: Provider) -> None:
    provider.script.always["MAIL"] = "550 5.7.1 Sender address rejected: not authorised"
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(ProviderUnavailable) as failure:
        send(mailer, "user@example.test")

    assert not isinstance(failure.value, MailRejected)
    assert provider.delivered_to() == []


# --- Pipelining: the envelope in one round trip ----------------------------------------------


class WholeEnvelopeProvider(LoopbackServer):
    """A raw-socket SMTP server that offers PIPELINING and answers MAIL FROM and RCPT TO only
    together with DATA: a client that waits for each reply before the next command gets none.
    It refuses the recipients in ``refused`` and, against RFC 2920, still accepts their DATA."""

    def __init__(self, refused: frozenset[str] = frozenset()) -> None:
        self.refused = refused
        self.received: list[bytes] = []
        super().__init__(self._session)

    def _session(self, connection: socket.socket) -> None:
        try:
            with connection, connection.makefile("rb") as lines:
                connection.sendall(b"220 whole.test ESMTP\r\n")
                held: list[bytes] = []
                for raw in lines:
                    verb = raw[:4].upper()
                    if verb == b"EHLO":
                        connection.sendall(b"250-whole.test\r\n250 PIPELINING\r\n")
                    elif verb == b"MAIL":
                        held.append(b"250 OK\r\n")
                    elif verb == b"RCPT":
                        address = raw.decode().partition("<")[2].partition(">")[0]
                        held.append(b"550 5.1.1 No such user\r\n" if address in self.refused else b"250 OK\r\n")
                    elif verb == b"DATA":
                        connection.sendall(b"".join([*held, b"354 Go ahead\r\n"]))
                        held.clear()
                        content: list[bytes] = []
                        for line in lines:
                            if line == b".\r\n":
                                break
                            content.append(line)
                        else:
                            return  # the client left before the message's end
                        self.received.append(b"".join(content))
                        connection.sendall(b"250 2.0.0 Accepted\r\n")
                    elif verb == b"QUIT":
                        connection.sendall(b"221 Bye\r\n")
                        return
                    else:
                        connection.sendall(b"250 OK\r\n")
        except OSError:
            pass  # the client gave up


@pytest.fixture
def whole_envelope(request: pytest.FixtureRequest) -> Iterator[WholeEnvelopeProvider]:
    provider = WholeEnvelopeProvider(**getattr(request, "param", {}))
    try:
        yield provider
    finally:
        provider.stop()


def test_to_a_provider_that_offers_pipelining_the_envelope_goes_in_one_round_trip(
    whole_envelope: WholeEnvelopeProvider,
) -> None:
    mailer = SmtpMailer(f"smtp://127.0.0.1:{whole_envelope.port}", timeout_seconds=2, sender=SENDER)

    send(mailer, "first@example.test")
    send(mailer, "second@example.test")

    assert [content.count(b"To: ") for content in whole_envelope.received] == [1, 1]
    assert b"To: first@example.test" in whole_envelope.received[0]
    assert b"To: second@example.test" in whole_envelope.received[1]
    assert whole_envelope.connections == 1


@pytest.mark.parametrize("whole_envelope", [{"refused": frozenset({"gone@example.test"})}], indirect=True)
def test_a_provider_that_accepts_data_after_refusing_the_recipient_is_left_at_once_for_a_new_connection(
    whole_envelope: WholeEnvelopeProvider,
) -> None:
    mailer = SmtpMailer(f"smtp://127.0.0.1:{whole_envelope.port}", timeout_seconds=5, sender=SENDER)
    started = time.monotonic()

    with pytest.raises(MailRejected) as rejected:
        send(mailer, "gone@example.test")

    elapsed = time.monotonic() - started
    assert rejected.value.recipient
    assert elapsed < 2.5, f"the refusal took {elapsed:.1f}s: the client waited in the provider's data mode"
    send(mailer, "next@example.test")
    assert [b"To: next@example.test" in content for content in whole_envelope.received] == [True]
    assert whole_envelope.connections == 2


# --- Personal data in the provider's replies ---------------------------------------------------


#: Whose address the provider echoes back in its replies.
PERSON = "user1@example.test"
#: An address with an apostrophe, which a dot-atom allows: the mask once began after it, and left
#: ``<mary.o'`` in the error.
WITH_APOSTROPHE = "mary.o'brien@example.test"


def refuse_always(provider: Provider, command: str, reply: str) -> None:
    """Have the provider answer ``reply`` to ``command`` (or to the content) every time."""
    if command == "content":
        provider.handler.fault = lambda rcpt, attempt: reply
    else:
        provider.script.always[command] = reply


def dead_letter_text(error: BaseException) -> str:
    """What the dead-letter store keeps of ``error`` (reports.worker.retries): its message and traceback."""
    return f"{error}\n{''.join(traceback.format_exception(error))}"


@pytest.mark.parametrize("person", [PERSON, WITH_APOSTROPHE])
@pytest.mark.parametrize(
    ("command", "reply", "expected"),
    [
        ("RCPT", "550 5.1.1 <{person}>: Recipient address rejected: User unknown", MailRejected),
        ("RCPT", "550 5.1.1 Recipient '{person}' not found by SMTP address lookup", MailRejected),
        ("RCPT", "421 4.7.0 <{person}>: too many messages, try later", RateLimited),
        ("RCPT", "452 4.2.2 <{person}>: Mailbox full", MailDeferred),
        ("MAIL", "550 5.7.1 <reports@reports.test>: Sender rejected for {person}", ProviderUnavailable),
        ("content", "554 5.7.1 Message to {person} rejected as spam", MailRejected),
    ],
)
def test_addresses_in_the_providers_reply_are_kept_out_of_the_error(
    provider: Provider, command: str, reply: str, expected: type[Exception], person: str
) -> None:
    refuse_always(provider, command, reply.format(person=person))
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(expected) as raised:
        send(mailer, person)

    text = dead_letter_text(raised.value)
    assert person.partition("'")[0] not in text, "no part of the address is left"
    assert "reports@reports.test" not in text
    assert "@" not in str(raised.value)
    assert reply.split()[0] in str(raised.value), "the reply code is still there for the operator"
    assert "<<" not in str(raised.value) and ">>" not in str(raised.value)


@pytest.mark.parametrize(
    "named",
    ['"jane doe"@example.test', "jane.doe@[192.0.2.7]", '"jane doe"@[IPv6:2001:db8::7]'],
)
def test_a_quoted_local_part_and_a_domain_literal_in_a_reply_are_masked_too(provider: Provider, named: str) -> None:
    # An address in the forms RFC 5321 also allows, named by a provider that forwards or aliases.
    provider.script.always["RCPT"] = f"550 5.1.1 <{named}>: Recipient address rejected: User unknown"
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(MailRejected) as raised:
        send(mailer, PERSON)

    assert str(raised.value) == "SMTP 550: 5.1.1 <address>: Recipient address rejected: User unknown"
    assert "jane" not in dead_letter_text(raised.value)


def test_a_masked_address_reads_address_in_its_own_brackets(provider: Provider) -> None:
    provider.script.always["RCPT"] = "550 5.1.1 <user1@example.test>: Recipient address rejected: User unknown"
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(MailRejected) as raised:
        send(mailer, PERSON)

    assert str(raised.value) == "SMTP 550: 5.1.1 <address>: Recipient address rejected: User unknown"


@pytest.mark.parametrize(
    ("command", "reply", "bounce", "about_address"),
    [
        ("RCPT", "550 5.1.1 <user1@example.test>: Recipient address rejected: User unknown", True, True),
        ("RCPT", "550 User unknown", True, True),
        # A session error's code, but the enhanced code says the address cannot be read.
        ("RCPT", "501 5.1.3 Bad recipient address syntax", True, True),
        ("RCPT", "554 5.7.1 <user1@example.test>: Relay access denied", False, False),
        ("content", "550 5.1.1 No such user", False, True),
        ("content", "552 5.3.4 Error: message file too big", False, False),
        ("content", "554 5.7.1 Message rejected as spam", False, False),
    ],
)
def test_a_refusal_is_a_hard_bounce_only_to_rcpt_and_about_the_address(
    provider: Provider, command: str, reply: str, bounce: bool, about_address: bool
) -> None:
    refuse_always(provider, command, reply)
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(MailRejected) as raised:
        send(mailer, PERSON)

    assert (raised.value.recipient, raised.value.about_address) == (bounce, about_address)


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        ("MAIL", "450 4.7.1 Error: too much mail from 127.0.0.1"),
        ("RCPT", "421 4.7.0 Too many messages, try again later"),
        ("RCPT", "451 Rate limit exceeded, slow down"),
    ],
)
def test_a_refusal_about_the_pace_is_rate_limited_not_a_deferral_of_the_message(
    provider: Provider, command: str, reply: str
) -> None:
    provider.script.replies[command] = [reply]
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises(RateLimited) as raised:
        send(mailer, "first@example.test")
    assert raised.value.code == int(reply[:3])

    send(mailer, "second@example.test")
    assert provider.delivered_to() == ["second@example.test"]


def test_the_mailer_gives_its_helo_name_in_ehlo(smtp_server) -> None:
    mailer = SmtpMailer(smtp_server.url, timeout_seconds=5, sender=SENDER, helo_name="mail.reports.test")

    send(mailer, "first@example.test")

    assert smtp_server.handler.helo_names == {"mail.reports.test"}


# --- One deadline for the whole send -------------------------------------------------------------


class SlowProvider(LoopbackServer):
    """A raw-socket SMTP server that answers every line correctly, each after ``delay`` seconds,
    or after ``slower``'s delay for the replies it names: (first word of the reply, how many
    such replies came before it on the connection)."""

    def __init__(self, delay: float, slower: dict[tuple[str, int], float] | None = None) -> None:
        self.delay = delay
        self.slower = slower or {}
        super().__init__(self._session)

    def _reply(self, connection: socket.socket, line: str, given: Counter[str]) -> None:
        word = line.split()[0]
        time.sleep(self.slower.get((word, given[word]), self.delay))
        given[word] += 1
        connection.sendall(line.encode() + b"\r\n")

    def _session(self, connection: socket.socket) -> None:
        try:
            with connection, connection.makefile("rb") as lines:
                given: Counter[str] = Counter()
                self._reply(connection, "220 slow.test ESMTP", given)
                in_data = False
                for raw in lines:
                    line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
                    if in_data:
                        if line == ".":
                            in_data = False
                            self._reply(connection, "250 2.0.0 Accepted", given)
                        continue
                    verb = line[:4].upper()
                    if verb == "DATA":
                        in_data = True
                        self._reply(connection, "354 End data with <CR><LF>.<CR><LF>", given)
                    elif verb == "QUIT":
                        self._reply(connection, "221 Bye", given)
                        return
                    else:
                        self._reply(connection, "250 OK", given)
        except OSError:
            pass  # the client gave up


def test_a_provider_slow_on_every_reply_cannot_stretch_one_send_past_its_deadline() -> None:
    slow = SlowProvider(delay=0.8)  # 0.8 s a reply is within any per-command timeout of 2 s
    try:
        mailer = SmtpMailer(f"smtp://127.0.0.1:{slow.port}", timeout_seconds=2, sender=SENDER)
        started = time.monotonic()

        with pytest.raises(ProviderUnavailable) as unavailable:
            send(mailer, "user@example.test")

        elapsed = time.monotonic() - started
        assert elapsed < 2.5, f"one send took {elapsed:.1f}s with a 2 s deadline (about 6 s of replies otherwise)"
        assert str(unavailable.value) == "SMTP provider did not answer in time: TimeoutError"
    finally:
        slow.stop()


def test_a_provider_nothing_listens_for_is_unreachable() -> None:
    mailer = SmtpMailer(f"smtp://127.0.0.1:{free_port()}", timeout_seconds=2, sender=SENDER)

    with pytest.raises(ProviderUnavailable) as unavailable:
        send(mailer, "user@example.test")

    assert str(unavailable.value) == "SMTP provider unreachable: ConnectionRefusedError"


def test_a_send_whose_deadline_passed_before_its_content_opens_no_second_connection() -> None:
    # MAIL FROM's reply comes after the deadline: the session is given up, and with no time left
    # the one more try on a new connection, kept for a session the provider broke, is not made.
    slow = SlowProvider(delay=0.0, slower={("250", 1): 2.0})
    try:
        mailer = SmtpMailer(f"smtp://127.0.0.1:{slow.port}", timeout_seconds=1, sender=SENDER)

        with pytest.raises(ProviderUnavailable):
            send(mailer, "user@example.test")

        time.sleep(0.5)  # the server's accept loop counts a connection within 0.2 s of its start
        assert slow.connections == 1
    finally:
        slow.stop()


def test_each_send_on_a_kept_connection_has_its_whole_deadline() -> None:
    # The first send's DATA reply comes late, so its content is written with little time left;
    # the second send's last reply takes longer than that, and is still within its own 2 s.
    slow = SlowProvider(delay=0.0, slower={("354", 0): 1.4, ("250", 6): 1.2})
    try:
        mailer = SmtpMailer(f"smtp://127.0.0.1:{slow.port}", timeout_seconds=2, sender=SENDER)
        send(mailer, "first@example.test")
        send(mailer, "second@example.test")
        assert slow.connections == 1
    finally:
        slow.stop()


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        ("550 5.1.1 jane.doe... User unknown", "SMTP 550: 5.1.1 <address>... User unknown"),
        ("550 5.1.1 User Jane.Doe not found here", "SMTP 550: 5.1.1 User <address> not found here"),
        ("452 4.2.2 Mailbox jane.doe is full", "SMTP 452: 4.2.2 Mailbox <address> is full"),
        # Another name that only begins like it is not the recipient's.
        ("550 5.1.1 jane.doe2 unknown", "SMTP 550: 5.1.1 jane.doe2 unknown"),
    ],
)
def test_the_recipients_local_part_alone_in_a_reply_is_masked_too(provider: Provider, reply: str, shown: str) -> None:
    refuse_always(provider, "RCPT", reply)
    mailer = SmtpMailer(provider.url, timeout_seconds=5, sender=SENDER)

    with pytest.raises((MailRejected, MailDeferred)) as raised:
        send(mailer, "jane.doe@example.test")

    assert str(raised.value) == shown
    # Still read as the reply it is: a 5xx about the address is a hard bounce of the recipient.
    if isinstance(raised.value, MailRejected):
        assert raised.value.recipient
