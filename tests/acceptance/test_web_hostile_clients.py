"""`reports web` against clients that send slowly, too much, to the wrong host, or leave: raw
sockets against the real process, with the read timeout and the connection cap set small."""

from __future__ import annotations

import http.client
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest
from argon2 import PasswordHasher

from tests.support.console import ADMIN_PASSWORD, ConsoleClient
from tests.support.databases import load_users
from tests.support.waiting import wait_until
from tests.support.web import ONE_CLICK, RawAnswer, open_raw, read_until_closed, request, suppressed

pytestmark = pytest.mark.acceptance

#: The read timeout the tests' web processes run with, in seconds.
READ_TIMEOUT = 1.0
#: What a close may take beyond the timeout on a loaded machine, in seconds.
SLACK = 3.0

FORM = b"Content-Type: application/x-www-form-urlencoded\r\n"


@pytest.fixture
def database_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """SQLite only: what a client can hold of the web process does not depend on the database."""
    return f"sqlite:///{tmp_path / 'reports.db'}"


def post_head(path: str, *headers: bytes, host: str = "127.0.0.1") -> bytes:
    return b"".join([f"POST {path} HTTP/1.1\r\nHost: {host}\r\n".encode(), FORM, *headers, b"\r\n"])


def assert_protected(answer: RawAnswer | dict[str, str]) -> None:
    headers = answer.headers if isinstance(answer, RawAnswer) else answer
    assert headers["cache-control"] == "no-store" and headers["referrer-policy"] == "no-referrer", headers


def test_a_request_whose_head_or_body_never_arrives_is_closed_within_the_read_timeout(sessions, start_web):
    web = start_web(web_read_timeout_seconds=READ_TIMEOUT)
    load_users(sessions, count=1)
    silent = open_raw(web)
    half_a_head = open_raw(web, post_head(web.path(1))[:40])
    no_body = open_raw(web, post_head(web.path(1), b"Content-Length: 26\r\n"))
    trickle = open_raw(web, post_head(web.path(1), b"Transfer-Encoding: chunked\r\n") + b"1\r\nL\r\n")

    for connection in (silent, half_a_head):
        answer = read_until_closed(connection)
        assert answer.status == 0 and answer.closed_after < READ_TIMEOUT + SLACK
    for connection in (no_body, trickle):
        answer = read_until_closed(connection)
        assert answer.status == 408 and answer.closed_after < READ_TIMEOUT + SLACK
        assert_protected(answer)
    assert suppressed(sessions) == {}
    assert "Traceback" not in web.log()


def test_beyond_the_connection_cap_requests_are_answered_503_until_the_slow_ones_are_cut_off(start_web):
    web = start_web(web_read_timeout_seconds=3 * READ_TIMEOUT, web_max_connections=3)
    slow = [open_raw(web, b"GET /healthz HTTP/1.1\r\n") for _ in range(3)]

    status, _, headers = request(f"{web.base_url}/healthz")
    assert status == 503
    assert_protected(headers)
    # The slow ones are cut off at the read timeout; then the cap admits the next client.
    wait_until(lambda: request(f"{web.base_url}/healthz")[0] == 200, timeout=3 * READ_TIMEOUT + SLACK, what="a 200")
    for connection in slow:
        assert read_until_closed(connection).status == 0


def test_a_chunked_one_click_post_unsubscribes(sessions, start_web):
    """A POST without Content-Length (Transfer-Encoding: chunked) is RFC 8058's one-click all the same."""
    web = start_web()
    load_users(sessions, count=2)
    connection = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
    connection.request(
        "POST",
        web.path(2),
        body=iter([ONE_CLICK[:10], ONE_CLICK[10:]]),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 200 and "unsubscribed" in response.read().decode()
    connection.close()
    assert suppressed(sessions) == {2: "unsubscribed"}


def test_a_body_over_the_cap_is_answered_413_with_or_without_content_length(sessions, start_web):
    web = start_web(web_read_timeout_seconds=READ_TIMEOUT)
    load_users(sessions, count=1)
    too_much = ONE_CLICK + b"&x=" + b"y" * 5000
    declared = open_raw(web, post_head(web.path(1), f"Content-Length: {len(too_much)}\r\n".encode()) + too_much)
    chunked = open_raw(
        web,
        post_head(web.path(1), b"Transfer-Encoding: chunked\r\n")
        + b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (too_much[:3000], too_much[3000:]))
        + b"0\r\n\r\n",
    )
    for connection in (declared, chunked):
        answer = read_until_closed(connection)
        assert answer.status == 413
        assert_protected(answer)
    assert suppressed(sessions) == {}


def test_a_request_for_another_host_is_refused_and_never_redirected_there(sessions, start_web):
    web = start_web()
    load_users(sessions, count=1)
    for host, path in (
        ("evil.example", f"{web.path(1)}/"),
        ("evil.example", web.path(1)),
        ("127.0.0.1", f"{web.path(1)}/"),
    ):
        answer = read_until_closed(
            open_raw(web, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        )
        assert answer.status in (400, 404) and "location" not in answer.headers, (host, path, answer)
        assert_protected(answer)
    one_click = post_head(web.path(1), b"Content-Length: 26\r\nConnection: close\r\n", host="evil.example")
    assert read_until_closed(open_raw(web, one_click + ONE_CLICK)).status == 400
    assert suppressed(sessions) == {}
    # A platform's health checker calls by address: the health check answers whatever the Host.
    health = read_until_closed(
        open_raw(web, b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.7:8000\r\nConnection: close\r\n\r\n")
    )
    assert (health.status, health.body) == (200, b"ok")


def test_bytes_that_are_not_http_are_answered_400_with_the_security_headers(start_web):
    web = start_web()
    answer = read_until_closed(open_raw(web, b"NOT HTTP AT ALL\r\n\r\n"))
    assert answer.status == 400
    assert_protected(answer)


def test_a_client_that_leaves_mid_body_is_one_log_line(sessions, start_web):
    web = start_web()
    load_users(sessions, count=1)
    before = web.log().splitlines()
    connection = open_raw(web, post_head(web.path(1), b"Content-Length: 26\r\n") + ONE_CLICK[:5])
    connection.close()
    wait_until(lambda: len(web.log().splitlines()) > len(before), timeout=10, what="the disconnect to be logged")
    assert web.log().splitlines()[len(before) :] == ["INFO:     A client left before its request body arrived."]
    assert suppressed(sessions) == {}


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


def test_logins_at_once_are_checked_a_few_at_a_time_so_their_memory_stays_bounded(sessions, start_web):
    # Argon2 at its production cost: 64 MiB a check.
    web = start_web(console_users=f"ada:admin:{PasswordHasher().hash(ADMIN_PASSWORD)}")
    guessers = [ConsoleClient(httpx.Client(base_url=web.base_url, follow_redirects=True)) for _ in range(12)]  # type: ignore[arg-type]
    tokens = [guesser.csrf() for guesser in guessers]
    warm = ConsoleClient(httpx.Client(base_url=web.base_url, follow_redirects=True))  # type: ignore[arg-type]
    assert warm.login("nobody", "wrong password") == 401
    before = peak_rss_mib(web.process.pid)
    ready = threading.Barrier(len(guessers))

    def guess(n: int) -> int:
        ready.wait()
        data = {"name": f"guess{n}", "password": "wrong password", "csrf": tokens[n]}
        return guessers[n].http.post("/console/login", data=data).status_code

    with ThreadPoolExecutor(len(guessers)) as pool:
        answers = list(pool.map(guess, range(len(guessers))))

    assert set(answers) <= {401, 503}, answers
    grew = peak_rss_mib(web.process.pid) - before
    assert grew < 3 * 64, f"the web process grew by {grew:.0f} MiB for {len(guessers)} logins at once"
    ada = ConsoleClient(httpx.Client(base_url=web.base_url, follow_redirects=True))  # type: ignore[arg-type]
    assert ada.login("ada", ADMIN_PASSWORD) == 200
    assert "Traceback" not in web.log()
