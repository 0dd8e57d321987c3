"""`reports web` as a real process: the one-click POST a mailbox provider sends, the pages a person
sees (in headless Chromium), forged tokens, the health check, and a clean stop on SIGTERM."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from reports import suppressions
from reports.clock import utcnow
from reports.delivery import pipeline
from reports.delivery.mail.backend import build_mailer
from reports.jobs import ReportJob
from reports.models import SuppressionReason
from reports.periods import Period
from reports.tokens import Signer
from tests.integration.conftest import PERIOD, RecordingQueue, walk_everything
from tests.support.browser import chromium_path, launch
from tests.support.databases import load_users
from tests.support.processes import free_port, run_cli
from tests.support.web import ONE_CLICK, SECRET, request, suppressed

pytestmark = pytest.mark.acceptance

OLD_SECRET = "test-old-unsubscribe-secret-98765"


def test_the_one_click_post_of_a_received_email_unsubscribes_and_the_next_period_skips_the_user(
    settings, sessions, smtp_server, start_web
):
    web = start_web()
    load_users(sessions, count=4)
    walk_everything(sessions, settings)
    mail_settings = replace(web.settings, smtp_url=smtp_server.url, template_version="v2")
    context = pipeline.Context(settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings))
    assert pipeline.run(context, ReportJob(PERIOD, 3, "v2")) == pipeline.Outcome.DELIVERED
    [message] = smtp_server.messages
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = message["List-Unsubscribe"].strip("<>")
    assert link.startswith(f"{web.base_url}/u/3.")

    # What Gmail or Yahoo sends when the person clicks "Unsubscribe" in the mail client.
    status, _, headers = request(link, body=ONE_CLICK)
    assert status == 200
    assert "set-cookie" not in headers
    assert suppressed(sessions) == {3: "unsubscribed"}
    # Again (a provider retries, a person clicks twice): still 2xx, nothing more.
    assert request(link, body=ONE_CLICK)[0] == 200
    assert suppressed(sessions) == {3: "unsubscribed"}

    queue = RecordingQueue()
    walk_everything(sessions, settings, Period.parse("2026-11"), queue=queue)
    assert sorted(queue.user_ids) == [1, 2, 4]


def test_a_multipart_one_click_post_unsubscribes_too(sessions, start_web):
    """RFC 8058 lets the provider send the body as multipart/form-data."""
    web = start_web()
    load_users(sessions, count=2)
    body = b'--b\r\nContent-Disposition: form-data; name="List-Unsubscribe"\r\n\r\nOne-Click\r\n--b--\r\n'
    assert request(web.url(1), body=body, content_type="multipart/form-data; boundary=b")[0] == 200
    assert suppressed(sessions) == {1: "unsubscribed"}


def test_opening_the_link_shows_a_confirm_button_and_changes_nothing(sessions, start_web):
    web = start_web()
    load_users(sessions, count=2)
    for _ in range(3):  # a link scanner, a preview, the person
        status, page, headers = request(web.url(2))
        assert status == 200
        assert '<form method="post"' in page and "<button" in page
        assert headers["cache-control"] == "no-store" and headers["referrer-policy"] == "no-referrer"
    assert suppressed(sessions) == {}


@pytest.mark.parametrize(
    ("accept_language", "lang", "heading"),
    [
        ("tr-TR,tr;q=0.9,en;q=0.8", "tr", "Monthly Reports aboneliğinden çıkılsın mı?"),
        ("fr-FR, uz-Latn;q=0.7, de;q=0.5", "uz-Latn", "Monthly Reports obunasini bekor qilasizmi?"),
        ("en;q=0.2, de-CH", "de", "Monthly Reports abbestellen?"),
        ("ja, *;q=0.1", "en", "Unsubscribe from Monthly Reports?"),
        (None, "en", "Unsubscribe from Monthly Reports?"),
    ],
)
def test_the_pages_speak_the_shipped_language_the_browser_prefers(sessions, start_web, accept_language, lang, heading):
    web = start_web()
    load_users(sessions, count=1)
    extra = {"Accept-Language": accept_language} if accept_language else {}
    status, page, _ = request(web.url(1), extra=extra)
    assert status == 200
    assert f'<html lang="{lang}">' in page and f"<h1>{heading}</h1>" in page
    status, done, _ = request(web.url(1), body=ONE_CLICK, extra=extra)
    assert status == 200 and f'<html lang="{lang}">' in done
    assert suppressed(sessions) == {1: "unsubscribed"}


def test_a_post_without_the_one_click_body_changes_nothing(sessions, start_web):
    web = start_web()
    load_users(sessions, count=2)
    assert request(web.url(1), body=b"")[0] == 400
    assert request(web.url(1), body=b"List-Unsubscribe=No")[0] == 400
    assert suppressed(sessions) == {}


def test_forged_or_altered_tokens_answer_404_without_detail_and_change_nothing(sessions, start_web):
    web = start_web()
    load_users(sessions, count=3)
    real = web.url(1)
    token = real.rsplit("/", 1)[1]
    signature = token.rsplit(".", 1)[1]
    forged = [
        real[:-1] + ("A" if real[-1] != "A" else "B"),  # one character changed
        f"{web.base_url}/u/2.{token.split('.', 1)[1]}",  # user 1's signature on user 2
        f"{web.base_url}/u/{Signer.from_secrets(('someone-elses-secret-123',)).token(1)}",
        f"{web.base_url}/u/1.abcd.{signature}",  # unknown key id
        f"{web.base_url}/u/1",
        f"{web.base_url}/u/%00",
    ]
    answers = set()
    for url in forged:
        for body in (None, ONE_CLICK):
            status, page, _ = request(url, body=body)
            assert status == 404, url
            answers.add(page)
        assert request(f"{url}/resubscribe", body=b"")[0] in (404, 405)
    assert answers == {"Not found."}
    assert suppressed(sessions) == {}


def test_links_signed_before_a_secret_rotation_keep_working(sessions, start_web):
    load_users(sessions, count=2)
    old_link_token = Signer.from_secrets((OLD_SECRET,)).token(2)
    web = start_web(secret=f"{SECRET},{OLD_SECRET}")  # new first, the old one kept for the overlap
    assert request(f"{web.base_url}/u/{old_link_token}", body=ONE_CLICK)[0] == 200
    assert suppressed(sessions) == {2: "unsubscribed"}
    assert web.url(1).rsplit("/", 1)[1] == Signer.from_secrets((SECRET,)).token(1)


def test_resubscribing_lifts_an_unsubscribe_but_never_a_bounce(sessions, start_web):
    web = start_web()
    load_users(sessions, count=2)
    with sessions.begin() as session:
        suppressions.add(session, 2, SuppressionReason.BOUNCED, now=utcnow(), source="smtp 550")
    assert request(web.url(1), body=ONE_CLICK)[0] == 200
    assert request(f"{web.url(1)}/resubscribe", body=b"")[0] == 200
    status, page, _ = request(f"{web.url(2)}/resubscribe", body=b"")
    assert status == 200 and "stay paused" in page
    assert suppressed(sessions) == {2: "bounced"}


def test_healthz_answers_and_sigterm_stops_the_server_with_exit_0(start_web):
    web = start_web()
    status, body, _ = request(f"{web.base_url}/healthz")
    assert (status, body) == (200, "ok")
    assert web.stop() == 0
    assert "Traceback" not in web.log_path.read_text()


def test_ctrl_c_stops_the_server_with_exit_0_and_no_error(start_web):
    web = start_web()
    assert request(f"{web.base_url}/healthz")[0] == 200
    web.process.send_signal(signal.SIGINT)
    assert web.process.wait(timeout=15) == 0
    assert "error:" not in web.log() and "Traceback" not in web.log()


def test_reports_web_rejects_a_port_in_use_in_one_line(settings, start_web):
    web = start_web()
    result = run_cli(web.settings, "web", "--host", "127.0.0.1", "--port", web.base_url.rsplit(":", 1)[1])
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Cannot listen on 127.0.0.1" in errors[0], result.stderr
    assert run_cli(settings, "web", "--port", "0").returncode == 2


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_reports_web_beyond_this_machine_without_a_secret_of_its_own_refuses_to_start(settings, host):
    # The built-in development secret is in the source: anyone reaching the server could sign links.
    port = str(free_port())
    result = run_cli(settings, "web", "--host", host, "--port", port, timeout=20)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: UNSUBSCRIBE_SECRET is unset") and host in line, line


def test_a_person_confirms_in_a_browser_sees_it_done_and_resubscribes(sessions, start_web):
    chromium_path()
    from playwright.sync_api import sync_playwright

    web = start_web()
    load_users(sessions, count=2)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page()
            page.goto(web.url(1))
            assert page.get_by_role("heading").inner_text() == "Unsubscribe from Monthly Reports?"
            assert suppressed(sessions) == {}, "opening the page unsubscribed"

            page.get_by_role("button", name="Unsubscribe").click()
            page.wait_for_load_state()
            assert page.get_by_role("heading").inner_text() == "You are unsubscribed"
            assert suppressed(sessions) == {1: "unsubscribed"}
            assert page.context.cookies() == []

            page.get_by_role("button", name="Resubscribe").click()
            page.wait_for_load_state()
            assert page.get_by_role("heading").inner_text() == "You are subscribed again"
            assert suppressed(sessions) == {}
            assert page.get_by_role("button", name="Unsubscribe").is_visible()
        finally:
            browser.close()
