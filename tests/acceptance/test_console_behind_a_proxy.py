"""The console's login limit per address behind a platform's router: a real `reports web` process,
reached from 127.0.0.2 (the router, as the server sees it) with each client's address in
X-Forwarded-For, as a PaaS router sends it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx2 as httpx

from reports.console import throttle
from tests.support.console import ADMIN_PASSWORD, CONSOLE_USERS, ConsoleClient
from tests.support.databases import load_users
from tests.support.web import WebProcess

ROUTER = "127.0.0.2"


@contextmanager
def through_the_router(web: WebProcess, client_address: str) -> Iterator[ConsoleClient]:
    transport = httpx.HTTPTransport(local_address=ROUTER)
    headers = {"X-Forwarded-For": client_address}
    with httpx.Client(base_url=web.base_url, transport=transport, headers=headers, follow_redirects=True) as http:
        yield ConsoleClient(http)  # type: ignore[arg-type]


def guessed_from_twenty_clients_then_ada_logs_in(start_web: Callable[..., WebProcess], **settings: object) -> int:
    """An attacker's failed logins under made-up names, each from a client of its own; then ada's
    login with the right password, from another client: its status."""
    web = start_web(console_users=CONSOLE_USERS, **settings)
    for n in range(throttle.MAX_FAILURES_PER_ADDRESS):
        with through_the_router(web, f"203.0.113.{n + 1}") as attacker:
            assert attacker.login(f"guess{n}", "wrong password") == 401
    with through_the_router(web, "198.51.100.7") as ada:
        return ada.login("ada", ADMIN_PASSWORD)


def test_behind_a_trusted_router_one_clients_guesses_do_not_lock_out_the_others(sessions, start_web):
    load_users(sessions, count=1)
    assert guessed_from_twenty_clients_then_ada_logs_in(start_web, forwarded_allow_ips=ROUTER) == 200


def test_behind_a_router_not_listed_every_client_counts_as_the_router(sessions, start_web):
    load_users(sessions, count=1)
    # The default trusts only a proxy on this machine (127.0.0.1): the router's own address is
    # the one the limit counts, so twenty guesses from anywhere lock everyone out.
    assert guessed_from_twenty_clients_then_ada_logs_in(start_web) == 429


def test_trusting_every_proxy_a_client_cannot_pick_the_address_the_limit_counts(sessions, start_web):
    load_users(sessions, count=1)
    web = start_web(console_users=CONSOLE_USERS, forwarded_allow_ips="*")
    # Each guess claims another address, and the last five claim ada's: the router appends the
    # address it took them from, the attacker's own.
    for n in range(throttle.MAX_FAILURES_PER_ADDRESS):
        claimed = "198.51.100.7" if n >= throttle.MAX_FAILURES_PER_ADDRESS - 5 else f"203.0.113.{n + 1}"
        with through_the_router(web, f"{claimed}, 192.0.2.66") as attacker:
            assert attacker.login(f"guess{n}", "wrong password") == 401
    with through_the_router(web, "203.0.113.200, 192.0.2.66") as attacker:
        assert attacker.login("guess", "wrong password") == 429
    with through_the_router(web, "198.51.100.7") as ada:
        assert ada.login("ada", ADMIN_PASSWORD) == 200


def test_an_ipv6_client_is_counted_by_its_64_not_by_each_of_its_addresses(sessions, start_web):
    load_users(sessions, count=1)
    web = start_web(console_users=CONSOLE_USERS, forwarded_allow_ips=ROUTER)
    # One host holds a whole /64: each guess from another address of it.
    for n in range(throttle.MAX_FAILURES_PER_ADDRESS):
        with through_the_router(web, f"2001:db8:1:2::{n + 1:x}") as attacker:
            assert attacker.login(f"guess{n}", "wrong password") == 401
    with through_the_router(web, "2001:db8:1:2:ffff::9") as attacker:
        assert attacker.login("ada", ADMIN_PASSWORD) == 429
    # Another network's client is not held up.
    with through_the_router(web, "2001:db8:1:3::1") as ada:
        assert ada.login("ada", ADMIN_PASSWORD) == 200
