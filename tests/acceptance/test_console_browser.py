"""The operator console in headless Chromium against `reports web` and real `dramatiq actors` workers:
an admin logs in, triggers last month, watches its progress move without a reload, finds the dead
letter by reason, replays it and sees it delivered, and suppresses a user; and the console refuses
a visitor without a login, a forged CSRF token, a viewer acting, an expired session and a login
past the throttle.

With CONSOLE_SCREENSHOTS=DIR (scripts/console-screenshots) it saves a screenshot of each view at
375 px into DIR, for the docs."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from reports.console import throttle
from reports.models import DeadLetter
from tests.integration.conftest import PERIOD
from tests.support.browser import chromium_path, launch
from tests.support.console import ADMIN_PASSWORD, CONSOLE_USERS, VIEWER_PASSWORD
from tests.support.databases import load_users
from tests.support.waiting import wait_until
from tests.support.web import suppressed

pytestmark = pytest.mark.acceptance

#: The one address the provider refuses, for good, until the test lifts the fault.
REFUSED = "user3@example.test"
#: A phone's width: every view must read there.
PHONE = {"width": 375, "height": 812}


def _shoot(page: Any, name: str) -> None:
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / f"console-{name}.png"), full_page=True)


def _login(page: Any, base_url: str, name: str, password: str) -> None:
    page.goto(f"{base_url}/console/")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()


def _cells(page: Any) -> dict[str, str]:
    """Every cell at one instant: cells read one call apart may straddle the page's refresh."""
    return page.evaluate(
        """() => {
            const cells = {};
            for (const cell of document.querySelectorAll("[data-field]")) {
                cells[cell.dataset.field] ??= cell.innerText;
            }
            return cells;
        }"""
    )


def test_an_operator_runs_a_period_replays_its_dead_letter_and_suppresses_a_user_in_a_browser(
    settings, sessions, smtp_server, start_web, start_workers
):
    chromium_path()
    from playwright.sync_api import sync_playwright

    population = load_users(sessions, count=30)
    handler = smtp_server.handler
    handler.fault = lambda rcpt, _attempt: "554 5.7.1 Message refused by policy" if rcpt == REFUSED else None
    # One sender at a quarter second a mail, held by the server after three until the page has
    # shown a count between the first and the last: its reads come every two seconds, however slow
    # the browser is, and the hold does not wait for this test's loop to notice the three.
    handler.delay_seconds = 0.25
    handler.hold_after = 3
    web = start_web(console_users=CONSOLE_USERS, smtp_url=smtp_server.url)
    start_workers(replace(web.settings, smtp_url=smtp_server.url), processes=1, threads=1)
    active = len(population.active)

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport=PHONE)
            _login(page, web.base_url, "ada", ADMIN_PASSWORD)
            assert page.get_by_role("heading").inner_text() == "Periods"
            page.get_by_label("Period").fill(str(PERIOD))
            page.get_by_role("button", name="Trigger").click()
            page.wait_for_load_state()
            assert page.get_by_role("heading").inner_text() == f"Period {PERIOD}"

            # The counts move while the page stays loaded: its script reads them every few seconds.
            url = page.url
            seen = set()
            deadline = time.monotonic() + 90
            # Read at one instant: the first look, before the walk, shows no item pending, and a
            # refresh between reading "pending" and "planned" once ended this loop before any send.
            while (cells := _cells(page))["pending"] != "0" or cells["planned"] != "yes":
                delivered = int(cells["delivered"])
                seen.add(delivered)
                if 0 < delivered < active - 1 and not handler.answering.is_set():
                    _shoot(page, "period")
                    handler.answering.set()
                assert time.monotonic() < deadline, "the period page never showed the run finish"
                page.wait_for_timeout(200)
            assert page.url == url, "the page was reloaded"
            assert len({n for n in seen if 0 < n < active - 1}) >= 1, seen
            assert (cells["delivered"], cells["dead"]) == (str(active - 1), "1")

            page.goto(f"{web.base_url}/console/dead-letters?period={PERIOD}&reason=permanent")
            _shoot(page, "dead-letters")
            rows = page.locator("tbody tr")
            assert rows.count() == 1 and "554" in rows.first.inner_text()
            handler.fault = None
            rows.first.get_by_role("link").click()
            _shoot(page, "dead-letter")
            page.get_by_role("button", name="Replay").click()
            page.wait_for_load_state()
            assert "Replayed dead letter" in page.locator(".flash").inner_text()
            page.goto(f"{web.base_url}/console/periods/{PERIOD}")
            wait_until(lambda: _cells(page)["delivered"] == str(active), timeout=30, what="the replay to be delivered")
            assert _cells(page)["dead"] == "0"
            assert [m for rcpt, m in handler.messages if rcpt == [REFUSED]] != []
            assert sum(rcpt == [REFUSED] for rcpt, _ in handler.messages) == 1

            page.goto(f"{web.base_url}/console/suppressions")
            page.get_by_label("User id", exact=True).fill("4")
            page.get_by_label("Reason").select_option("complained")
            page.get_by_role("button", name="Suppress").click()
            page.wait_for_load_state()
            assert "User 4 suppressed (complained)." in page.locator(".flash").inner_text()
            assert suppressed(sessions) == {4: "complained"}
            _shoot(page, "suppressions")

            for view in ("periods", "fleet", "audit"):
                page.goto(f"{web.base_url}/console/{view}")
                _shoot(page, view)
            page.goto(f"{web.base_url}/console/preview?period={PERIOD}&user=2")
            page.frame_locator("iframe.report").locator("body").wait_for()
            _shoot(page, "preview")
            audit = page.goto(f"{web.base_url}/console/audit")
            assert audit is not None
            text = page.locator("tbody").inner_text()
            for action in ("login", "trigger", "replay", "suppress"):
                assert f"ada\t{action}" in text, text

            # A forged CSRF token: the form posts, the console refuses, nothing changes.
            page.goto(f"{web.base_url}/console/suppressions")
            page.locator('form:has(button:text("Suppress")) input[name="csrf"]').evaluate("e => e.value = 'forged'")
            page.get_by_label("User id", exact=True).fill("6")
            page.get_by_role("button", name="Suppress").click()
            assert "forged" in page.locator("body").inner_text()
            assert suppressed(sessions) == {4: "complained"}
        finally:
            browser.close()


def test_the_console_refuses_visitors_viewers_expired_sessions_and_guessers_in_a_browser(settings, sessions, start_web):
    chromium_path()
    from playwright.sync_api import sync_playwright

    load_users(sessions, count=5)
    web = start_web(console_users=CONSOLE_USERS, console_session_seconds=3)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            # No login: every page is the login form.
            visitor = browser.new_page(viewport=PHONE)
            visitor.goto(f"{web.base_url}/console/dead-letters")
            assert visitor.get_by_role("heading").inner_text() == "Log in"
            _shoot(visitor, "login")

            # A viewer sees the pages, has no buttons, and a POST it makes anyway is refused.
            viewer = browser.new_page(viewport=PHONE)
            _login(viewer, web.base_url, "vic", VIEWER_PASSWORD)
            assert viewer.get_by_role("heading").inner_text() == "Periods"
            assert viewer.get_by_role("button", name="Trigger").count() == 0
            csrf = viewer.locator('input[name="csrf"]').first.get_attribute("value")
            answer = viewer.request.post(
                f"{web.base_url}/console/suppressions", form={"csrf": csrf, "user": "1", "reason": "complained"}
            )
            assert answer.status == 403 and "Viewers can look" in answer.text()
            assert suppressed(sessions) == {}

            # After CONSOLE_SESSION_SECONDS the session is over, for pages and for posts.
            admin = browser.new_page(viewport=PHONE)
            _login(admin, web.base_url, "ada", ADMIN_PASSWORD)
            csrf = admin.locator('input[name="csrf"]').first.get_attribute("value")
            wait_until(
                lambda: admin.goto(f"{web.base_url}/console/periods") and "/login" in admin.url,
                timeout=10,
                interval=0.5,
                what="the session to expire",
            )
            # The browser drops the cookie at its Max-Age; the server checks the login's age as well
            # (tests/integration/test_console.py keeps the cookie and moves the clock).
            assert admin.get_by_role("heading").inner_text() == "Log in"
            answer = admin.request.post(f"{web.base_url}/console/periods", form={"csrf": csrf, "period": "2026-10"})
            assert answer.status == 403
            with sessions() as session:
                assert session.scalars(select(DeadLetter)).all() == []

            # Past the throttle, even the right password is refused.
            guesser = browser.new_page(viewport=PHONE)
            for _ in range(throttle.MAX_FAILURES_PER_USER):
                _login(guesser, web.base_url, "vic", "not the password")
                assert "Wrong name or password" in guesser.locator(".error").inner_text()
            _login(guesser, web.base_url, "vic", VIEWER_PASSWORD)
            assert "Too many failed logins" in guesser.locator(".error").inner_text()
            assert guesser.get_by_role("heading").inner_text() == "Log in"
        finally:
            browser.close()
