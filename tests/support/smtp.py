"""Mail providers for the tests: one that records what it accepts (and refuses on cue), and loopback
TCP servers for scripted, dead and slow ones."""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesHeaderParser
from typing import Any, cast

from aiosmtpd.controller import Controller

#: Decides a reply for one delivery: given (recipient, 1-based attempt for that recipient), an SMTP
#: reply such as "550 5.1.1 No such user" to refuse it, or None to accept it.
Fault = Callable[[str, int], "str | None"]


#: What a server that limits its clients answers past the limit (Postfix's words).
TOO_MUCH_MAIL = "450 4.7.1 Error: too much mail from {client}"


@dataclass
class RateLimit:
    """At most ``messages`` per ``window_seconds`` from one client address, as Postfix's anvil
    counts them: a window opens at the client's first message after the last one ended, and past
    the limit every MAIL FROM is answered ``450 4.7.1 … too much mail`` until it ends."""

    messages: int
    window_seconds: float
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, tuple[float, int]] = field(default_factory=dict)

    def admits(self, client: str) -> bool:
        now = self.clock()
        opened, count = self._windows.get(client, (now, 0))
        if now - opened >= self.window_seconds:
            opened, count = now, 0
        if count >= self.messages:
            return False
        self._windows[client] = (opened, count + 1)
        return True

    def pace_seconds(self, messages: int) -> float:
        """How long ``messages`` take at the limit's pace."""
        return messages * self.window_seconds / self.messages


class ReceivedMessage:
    """A message the provider accepted, parsed only as far as a test reads it.

    Parsing a whole report (about 23 kB in two parts) with ``email.policy.default`` took about 2 ms
    of the test process's CPU per email, on the server's thread and while it held the recorder's
    lock; most tests read only headers (the user id, the Message-ID), which the header block
    answers in a tenth of that. Any other use parses the whole message, once.
    """

    def __init__(self, content: bytes) -> None:
        self.content = content

    @functools.cached_property
    def _headers(self) -> EmailMessage:
        return cast(EmailMessage, BytesHeaderParser(policy=email.policy.default).parsebytes(self.content))

    @functools.cached_property
    def whole(self) -> EmailMessage:
        return cast(EmailMessage, email.message_from_bytes(self.content, policy=email.policy.default))

    def __getitem__(self, name: str) -> Any:
        return self._headers[name]

    def __contains__(self, name: str) -> bool:
        return name in self._headers

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def get(self, name: str, failobj: Any = None) -> Any:
        return self._headers.get(name, failobj)

    def get_all(self, name: str, failobj: Any = None) -> Any:
        return self._headers.get_all(name, failobj)

    def keys(self) -> list[str]:
        return self._headers.keys()

    def items(self) -> list[tuple[str, Any]]:
        return self._headers.items()

    def __str__(self) -> str:
        return str(self.whole)

    def __bytes__(self) -> bytes:
        return bytes(self.whole)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.whole, name)


class RecordingHandler:
    """Keeps every accepted message with its envelope recipients; refuses what ``fault`` says."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[tuple[list[str], ReceivedMessage]] = []
        #: The envelope sender (MAIL FROM) of each accepted message, in the order of ``messages``.
        self.senders: list[str] = []
        self.attempts: dict[str, int] = {}
        self.refused: list[tuple[str, str]] = []
        self.fault: Fault | None = None
        #: Decides a reply to RCPT TO, given the address: an SMTP reply to refuse it, or None.
        self.rcpt_fault: Callable[[str], str | None] | None = None
        #: Seconds each message takes, to stretch a run so it can be interrupted. Spent before the
        #: data, as a slow network or a slow provider would; the final "." is answered at once.
        self.delay_seconds = 0.0
        #: Seconds the reply to the final "." waits after the message is kept: a provider that has
        #: the message while its client, past its deadline, cannot know it.
        self.answer_delay_seconds = 0.0
        #: Cleared, every delivery waits at RCPT TO until it is set again: sends held in flight.
        self.answering = threading.Event()
        self.answering.set()
        #: Once this many messages are kept, the server clears ``answering`` itself (``None``:
        #: never): a hold at a point in the run that does not depend on when the test looks.
        self.hold_after: int | None = None
        #: Deliveries that reached RCPT TO, held or not.
        self.arrived = 0
        #: Past it, MAIL FROM is refused for the pace (``None``: no limit).
        self.rate_limit: RateLimit | None = None
        #: MAIL FROMs refused for the pace.
        self.rate_refusals = 0
        #: The names clients gave in EHLO or HELO.
        self.helo_names: set[str] = set()
        #: Whether EHLO offers PIPELINING, as Postfix and the big providers do.
        self.pipelining = True

    async def handle_EHLO(self, server, session, envelope, hostname, responses):  # type: ignore[no-untyped-def]
        session.host_name = hostname
        if not self.pipelining:
            return responses
        return [*responses[:-1], "250-PIPELINING", responses[-1]]

    async def handle_MAIL(self, server, session, envelope, address, mail_options):  # type: ignore[no-untyped-def]
        client = session.peer[0]
        with self.lock:
            self.helo_names.add(session.host_name)
            if self.rate_limit is not None and not self.rate_limit.admits(client):
                self.rate_refusals += 1
                return TOO_MUCH_MAIL.format(client=client)
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # type: ignore[no-untyped-def]
        with self.lock:
            self.arrived += 1
        while not self.answering.is_set():
            await asyncio.sleep(0.02)
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
        if self.rcpt_fault is not None and (reply := self.rcpt_fault(address)) is not None:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]
        recipient = envelope.rcpt_tos[0]
        with self.lock:
            attempt = self.attempts[recipient] = self.attempts.get(recipient, 0) + 1
            reply = self.fault(recipient, attempt) if self.fault else None
            if reply is not None:
                self.refused.append((recipient, reply))
                return reply
            self.messages.append((list(envelope.rcpt_tos), ReceivedMessage(envelope.content)))
            self.senders.append(envelope.mail_from)
            if self.hold_after is not None and len(self.messages) >= self.hold_after:
                self.answering.clear()
                self.hold_after = None
        if self.answer_delay_seconds:
            await asyncio.sleep(self.answer_delay_seconds)
        return "250 Message accepted for delivery"


@dataclass
class SmtpServer:
    url: str
    handler: RecordingHandler
    controller: Controller

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    running: bool = True

    def stop(self) -> None:
        """Take the provider down (its port is free until :meth:`start`)."""
        if self.running:
            self.controller.stop()
            self.running = False

    def start(self) -> None:
        """Bring the provider back on the same port, keeping what it recorded."""
        self.controller = Controller(self.handler, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        self.running = True

    @property
    def messages(self) -> list[ReceivedMessage]:
        with self.handler.lock:
            return [message for _, message in self.handler.messages]

    def by_user(self) -> dict[int, list[ReceivedMessage]]:
        grouped: dict[int, list[ReceivedMessage]] = {}
        for message in self.messages:
            grouped.setdefault(int(message["X-Report-User-Id"]), []).append(message)
        return grouped


#: How long :meth:`LoopbackServer.stop` waits for a handler to end once its connection is shut.
HANDLER_END_SECONDS = 5.0


class LoopbackServer:
    """A TCP server on the loopback that hands each connection it accepts to ``handle``, in a thread
    of its own, and counts them; port 0 takes a free one."""

    def __init__(self, handle: Callable[[socket.socket], None], port: int = 0) -> None:
        self.handle = handle
        self.connections = 0
        self._handlers: list[tuple[socket.socket, threading.Thread]] = []
        self._server = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            handler = threading.Thread(target=self.handle, args=(connection,), daemon=True)
            self._handlers.append((connection, handler))
            handler.start()

    def stop(self) -> None:
        """Stop listening, shut every connection, and check that each handler has ended: one that
        outlived its connection (a loop reading past the end of input) would spin in this test
        process for the rest of the run, taking CPU from every test after it."""
        self._stopping.set()
        self._thread.join()
        self._server.close()
        for connection, _ in self._handlers:
            with contextlib.suppress(OSError):  # closed by its handler already
                connection.shutdown(socket.SHUT_RDWR)
        for _, handler in self._handlers:
            handler.join(timeout=HANDLER_END_SECONDS)
        running = sum(handler.is_alive() for _, handler in self._handlers)
        assert not running, f"{running} connection handler(s) still running after their connections were shut"


class DeadProvider(LoopbackServer):
    """A mail provider that is down: it accepts TCP connections, counts them, and drops them at once."""

    def __init__(self, port: int) -> None:
        super().__init__(lambda connection: connection.close(), port)
