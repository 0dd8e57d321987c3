"""`reports web` as a real process, and the requests tests send it: ordinary ones through urllib,
hostile ones byte by byte over a raw socket."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from reports import tokens
from reports.settings import Settings

#: The secret the tests' web processes sign links with.
SECRET = "test-unsubscribe-secret-0123456789"

#: RFC 8058's one-click body.
ONE_CLICK = b"List-Unsubscribe=One-Click"


@dataclass
class WebProcess:
    process: subprocess.Popen[bytes]
    base_url: str
    settings: Settings
    log_path: Path

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def url(self, user_id: int) -> str:
        return tokens.links(self.settings).url(user_id)

    def path(self, user_id: int) -> str:
        return self.url(user_id).removeprefix(self.base_url)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def request(
    url: str,
    *,
    body: bytes | None = None,
    content_type: str = "application/x-www-form-urlencoded",
    extra: dict[str, str] | None = None,
) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of a GET, or of a POST when ``body`` is given, with ``extra`` request
    headers; (0, '', {}) if refused."""
    headers = ({"Content-Type": content_type} if body is not None else {}) | (extra or {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as response:
            return response.status, response.read().decode(), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}
    except OSError:
        return 0, "", {}


@dataclass(frozen=True)
class RawAnswer:
    """What a raw connection got back before the server closed it: ``status`` 0 if no answer."""

    status: int
    headers: dict[str, str]
    body: bytes
    #: Seconds the reader waited for the server to close.
    closed_after: float


def open_raw(web: WebProcess, data: bytes = b"") -> socket.socket:
    """A connection to ``web`` that has sent ``data`` and nothing more."""
    connection = socket.create_connection(("127.0.0.1", web.port), timeout=10)
    if data:
        connection.sendall(data)
    return connection


def read_until_closed(connection: socket.socket) -> RawAnswer:
    """Everything the server sends until it closes the connection; fails the test (a timeout) if it
    keeps it open for 10 s."""
    started = time.monotonic()
    received = b""
    with connection:
        while chunk := connection.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n") if head else ("",)
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    status = int(status_line.split()[1]) if status_line else 0
    return RawAnswer(status, headers, body, time.monotonic() - started)


def suppressed(sessions: sessionmaker[Session]) -> dict[int, str]:
    with sessions() as session:
        return dict(session.execute(text("SELECT user_id, reason FROM suppressions")).all())
