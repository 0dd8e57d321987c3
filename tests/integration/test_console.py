"""The operator console in-process, on SQLite and PostgreSQL with the real Redis: who gets in, what a
viewer and an admin may do, CSRF, the login throttle, session expiry, and the audit trail."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import jinja2
import pytest
import redis
from dramatiq import Message
from sqlalchemy import func, select, text
from starlette.testclient import TestClient

from reports import suppressions
from reports.clock import utcnow
from reports.console import app, throttle
from reports.console.throttle import LoginThrottle
from reports.failures import dead_letters
from reports.models import ConsoleAudit, DeadLetter, PeriodRun, RunState, SendNowRequest, SuppressionReason
from tests.integration.conftest import PERIOD, queued_user_ids, run_together, trigger
from tests.integration.test_dead_letters import report_dead
from tests.support.console import (
    ADMIN_PASSWORD,
    ADMIN_WITH_A_NEW_PASSWORD,
    VIEWER_ONLY,
    VIEWER_PASSWORD,
    Clock,
    ConsoleClient,
    client,
    console_settings,
)
from tests.support.databases import load_users
from tests.support.processes import free_port
from tests.support.web import SECRET, suppressed


@pytest.fixture
def console(settings, sessions):
    load_users(sessions, count=5)
    return client(console_settings(settings), sessions)


def queued_actors(settings, queue: str) -> list[str]:
    client = redis.Redis.from_url(settings.broker_url)
    stored = client.hgetall(f"{settings.broker_namespace}:{queue}.msgs")
    return [Message.decode(raw).actor_name for raw in stored.values()]


def audit_trail(sessions) -> list[tuple[str, str, str]]:
    with sessions() as session:
        return [(e.actor, e.action, e.target) for e in session.scalars(select(ConsoleAudit).order_by(ConsoleAudit.id))]


def test_the_console_answers_404_while_console_users_is_unset(settings, sessions):
    bare = client(replace(console_settings(settings), console_users=""), sessions)
    for path in ("/console/", "/console/login", "/console/periods"):
        assert bare.http.get(path).status_code == 404
    assert bare.http.post("/console/login", data={"name": "ada"}).status_code == 404


def test_without_a_login_every_page_leads_to_the_login_form_and_shows_nothing(console):
    for path in ("/console/", "/console/periods", "/console/dead-letters", "/console/fleet", "/console/audit"):
        answer = console.http.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/console/login", path
    page = console.http.get("/console/periods")
    assert page.url.path == "/console/login" and "Log in" in page.text and "Periods</h1>" not in page.text


def test_an_admin_logs_in_with_a_cookie_that_is_httponly_strict_and_scoped(console):
    csrf = console.csrf()
    answer = console.http.post(
        "/console/login", data={"name": "ada", "password": ADMIN_PASSWORD, "csrf": csrf}, follow_redirects=False
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/console/periods"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie
    # Loopback PUBLIC_BASE_URL (plain http): no Secure flag, or the browser would never send it back.
    assert "secure" not in cookie
    page = console.http.get("/console/periods")
    assert "<h1>Periods</h1>" in page.text and "ada (admin)" in page.text


def test_the_cookie_is_secure_when_public_base_url_is_https(settings, sessions):
    secure = client(
        console_settings(settings, public_base_url="https://reports.example.com", unsubscribe_secret=SECRET), sessions
    )
    secure.http = TestClient(secure.http.app, base_url="https://reports.example.com")
    assert "secure" in secure.http.get("/console/login").headers["set-cookie"].lower()


def test_pages_send_a_strict_content_policy_and_are_never_framed(console):
    answer = console.http.get("/console/login")
    policy = answer.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy


def test_a_wrong_password_or_an_unknown_name_is_refused(console):
    assert console.login("ada", "not the password") == 401
    assert console.login("nobody", ADMIN_PASSWORD) == 401
    assert console.http.get("/console/periods").url.path == "/console/login"


def test_logins_are_throttled_per_user_even_with_the_right_password(console, sessions):
    for _ in range(throttle.MAX_FAILURES_PER_USER):
        assert console.login("ada", "wrong password") == 401
    assert console.login("ada", ADMIN_PASSWORD) == 429
    # Another user from the same address is not locked out by ada's failures.
    assert console.login("vic", VIEWER_PASSWORD) == 200
    # The failures are recorded; the login refused past the limit is not (a flood would fill the table).
    assert audit_trail(sessions) == [("ada", "login", "from testclient")] * throttle.MAX_FAILURES_PER_USER + [
        ("vic", "login", "viewer")
    ]


def test_logins_are_throttled_per_address_across_user_names(settings, sessions):
    load_users(sessions, count=1)
    console = client(console_settings(settings), sessions)
    for n in range(throttle.MAX_FAILURES_PER_ADDRESS):
        assert console.login(f"guess{n}", "wrong password") == 401
    assert console.login("ada", ADMIN_PASSWORD) == 429
    elsewhere = client(console_settings(settings), sessions)
    elsewhere.http = TestClient(elsewhere.http.app, base_url="http://127.0.0.1:8000", client=("10.0.0.9", 1))
    assert elsewhere.login("ada", ADMIN_PASSWORD) == 200


def test_good_logins_from_one_address_never_reach_its_limit(console):
    # Each login counts as failed until its password is found right, then is taken back.
    for _ in range(throttle.MAX_FAILURES_PER_ADDRESS + 1):
        assert console.login("vic", VIEWER_PASSWORD) == 200
    for n in range(throttle.MAX_FAILURES_PER_ADDRESS - 1):
        assert console.login(f"guess{n}", "wrong password") == 401
    assert console.login("ada", ADMIN_PASSWORD) == 200


def test_guesses_sent_at_once_get_no_more_password_checks_than_the_limit(settings, sessions):
    load_users(sessions, count=1)
    guessers = [client(console_settings(settings), sessions) for _ in range(4 * throttle.MAX_FAILURES_PER_USER)]
    tokens = [guesser.csrf() for guesser in guessers]
    statuses: list[int] = []

    def guess(guesser: ConsoleClient, token: str) -> None:
        answer = guesser.http.post("/console/login", data={"name": "ada", "password": "wrong", "csrf": token})
        statuses.append(answer.status_code)

    run_together(*(lambda g=g, t=t: guess(g, t) for g, t in zip(guessers, tokens, strict=True)))

    # Counted before the password is checked: the guesses past the limit are refused unchecked.
    assert sorted(statuses) == [401] * throttle.MAX_FAILURES_PER_USER + [429] * (
        len(guessers) - throttle.MAX_FAILURES_PER_USER
    )


def test_a_post_with_a_forged_or_missing_csrf_token_is_refused_and_changes_nothing(console, sessions, settings):
    assert console.login() == 200
    for token in ("forged-token", ""):
        status, _ = console.post("/console/suppressions", {"user": "2", "reason": "complained"}, csrf=token)
        assert status == 403
    answer = console.http.post("/console/suppressions", data={"user": "2", "reason": "complained"})
    assert answer.status_code == 403
    assert suppressed(sessions) == {}
    # A token from another session does not pass either.
    other = client(console_settings(settings), sessions)
    assert other.login() == 200
    theirs = other.csrf("/console/periods")
    assert console.post("/console/suppressions", {"user": "2", "reason": "complained"}, csrf=theirs)[0] == 403
    assert suppressed(sessions) == {}


def test_a_login_form_without_the_csrf_token_is_refused(console):
    answer = console.http.post("/console/login", data={"name": "ada", "password": ADMIN_PASSWORD})
    assert answer.status_code == 403


def test_a_viewer_sees_every_page_and_every_post_gets_403_and_changes_nothing(console, sessions, settings):
    trigger(sessions, settings)
    assert console.login("vic", VIEWER_PASSWORD) == 200
    for path in (
        "/console/periods",
        f"/console/periods/{PERIOD}",
        "/console/dead-letters",
        "/console/suppressions",
        "/console/fleet",
        "/console/preview?period=2026-10&user=1",
        "/console/audit",
    ):
        page = console.http.get(path)
        assert page.status_code == 200, path
        assert ">Trigger</button>" not in page.text and "Replay all" not in page.text and ">Suppress<" not in page.text
    posts = [
        ("/console/periods", {"period": "2026-09"}),
        (f"/console/periods/{PERIOD}/cancel", {}),
        ("/console/suppressions", {"user": "1", "reason": "complained"}),
        ("/console/send-now", {"user": "1", "period": str(PERIOD)}),
        ("/console/dead-letters/replay", {"confirm": "1", "up_to": "1"}),
    ]
    for path, data in posts:
        assert console.post(path, data)[0] == 403, path
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(PeriodRun)) == 1
        assert session.get(PeriodRun, str(PERIOD)).state == RunState.ACTIVE
    assert suppressed(sessions) == {}
    # Nothing done; each refusal recorded.
    assert audit_trail(sessions) == [("vic", "login", "viewer")] + [("vic", "post", path) for path, _ in posts]


def test_a_session_expires_after_console_session_seconds(settings, sessions):
    load_users(sessions, count=2)
    clock = Clock()
    console = client(console_settings(settings, console_session_seconds=600), sessions, clock)
    assert console.login() == 200
    csrf = console.csrf("/console/periods")
    clock.now += 599
    assert console.http.get("/console/periods").url.path == "/console/periods"
    clock.now += 2
    page = console.http.get("/console/periods")
    assert page.url.path == "/console/login" and "session expired" in page.text
    assert console.post("/console/suppressions", {"user": "1", "reason": "complained"}, csrf=csrf)[0] == 403
    assert suppressed(sessions) == {}


@pytest.mark.parametrize("console_users", [VIEWER_ONLY, ADMIN_WITH_A_NEW_PASSWORD], ids=["removed", "new password"])
def test_a_user_removed_or_given_a_new_password_in_console_users_is_signed_out(settings, sessions, console_users):
    console = client(console_settings(settings), sessions)
    assert console.login() == 200
    changed = client(console_settings(settings, console_users=console_users), sessions)
    changed.http.cookies = console.http.cookies
    assert changed.http.get("/console/periods").url.path == "/console/login"
    assert changed.login("ada", ADMIN_PASSWORD) == 401


def test_logging_out_ends_the_session_and_a_stale_form_says_so_instead(console):
    assert console.login() == 200
    stale = console.csrf("/console/periods")
    # Logged out and in again meanwhile, in another tab: the first tab's form is stale.
    assert console.post("/console/logout", csrf=console.csrf("/console/periods"))[0] == 200
    assert console.login() == 200
    answer = console.http.post("/console/logout", data={"csrf": stale})
    assert answer.status_code == 403 and "log out again" in answer.text
    assert console.http.get("/console/periods").url.path == "/console/periods"
    assert console.post("/console/logout")[0] == 200
    assert console.http.get("/console/periods").url.path == "/console/login"


def test_an_action_that_fails_half_way_is_in_the_audit_trail(settings, sessions):
    load_users(sessions, count=2)
    # The broker (RabbitMQ here; Redis keeps the shared state) is down: the trigger commits, then
    # its enqueue fails.
    down = console_settings(
        settings, broker_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/", redis_url=settings.shared_redis_url
    )
    console = client(down, sessions)
    assert console.login() == 200
    with pytest.raises(Exception) as failed:
        console.post("/console/periods", {"period": str(PERIOD)})
    with sessions() as session:
        assert session.get(PeriodRun, str(PERIOD)) is not None
        [(action, outcome)] = session.execute(
            select(ConsoleAudit.action, ConsoleAudit.outcome).where(ConsoleAudit.action != "login")
        ).all()
    assert (action, outcome) == ("trigger", f"failed: {type(failed.value).__name__} (the web process's log has more)")


def test_admin_actions_go_through_and_are_audited_with_who_did_them(console, sessions, settings):
    assert console.login() == 200
    assert console.post("/console/periods", {"period": str(PERIOD)})[0] == 200
    with sessions() as session:
        assert session.get(PeriodRun, str(PERIOD)) is not None
    page = console.http.get(f"/console/periods/{PERIOD}")
    assert "Period 2026-10" in page.text
    assert console.post(f"/console/periods/{PERIOD}/cancel")[0] == 200
    with sessions() as session:
        assert session.get(PeriodRun, str(PERIOD)).state == RunState.CANCELLED
    assert console.post("/console/periods", {"period": str(PERIOD)})[0] == 200
    with sessions() as session:
        assert session.get(PeriodRun, str(PERIOD)).state == RunState.ACTIVE

    status, page = console.post("/console/suppressions", {"user": "3", "reason": "complained"})
    assert status == 200 and "User 3 suppressed (complained)." in page
    assert suppressed(sessions) == {3: "complained"}
    with sessions() as session:
        assert suppressions.get(session, 3).source == "console ada"
    assert "User 3 is no longer suppressed" in console.post("/console/suppressions/3/remove")[1]
    assert suppressed(sessions) == {}
    # Bad input is one line on the page, changes nothing, and is audited as refused.
    assert "No user with id 99." in console.post("/console/suppressions", {"user": "99", "reason": "bounced"})[1]
    assert "has not ended yet" in console.post("/console/periods", {"period": "2999-01"})[1]

    assert audit_trail(sessions) == [
        ("ada", "login", "admin"),
        ("ada", "trigger", "period 2026-10"),
        ("ada", "cancel", "period 2026-10"),
        ("ada", "trigger", "period 2026-10"),
        ("ada", "suppress", "user 3"),
        ("ada", "unsuppress", "user 3"),
        ("ada", "suppress", "user 99"),
        ("ada", "trigger", "period 2999-01"),
    ]
    audit_page = console.http.get("/console/audit").text
    assert audit_page.index("period 2999-01") < audit_page.index("Triggered 2026-10")
    assert "refused: No user with id 99." in audit_page


def test_refused_logins_and_refused_actions_are_in_the_audit_trail_with_who_and_where(console, sessions):
    assert console.login("eve\x00", "guess") == 401
    assert console.login("vic", VIEWER_PASSWORD) == 200
    assert console.post(f"/console/periods/{PERIOD}/cancel")[0] == 403
    assert console.post("/console/periods", {"period": str(PERIOD)}, csrf="forged")[0] == 403
    with sessions() as session:
        rows = session.execute(
            select(ConsoleAudit.actor, ConsoleAudit.action, ConsoleAudit.target, ConsoleAudit.outcome).order_by(
                ConsoleAudit.id
            )
        ).all()
    assert [tuple(row) for row in rows] == [
        ("eve?", "login", "from testclient", "refused: Wrong name or password."),
        ("vic", "login", "viewer", "ok"),
        ("vic", "post", f"/console/periods/{PERIOD}/cancel", "refused: Viewers can look but not act."),
        ("vic", "post", "/console/periods", "refused: The form is stale or forged: reload the page and try again."),
    ]
    assert "refused: Viewers can look but not act." in console.http.get("/console/audit").text


def test_send_now_from_the_preview_queues_the_commands_request(console, sessions, settings):
    trigger(sessions, settings)
    assert console.login() == 200
    status, page = console.post("/console/send-now", {"user": "2", "period": str(PERIOD)})
    assert status == 200 and "Queued send-now request" in page
    assert queued_actors(settings, "critical") == ["send_report_now"]


def test_send_now_with_the_broker_down_says_the_request_is_recorded_for_reconcile(settings, sessions):
    load_users(sessions, count=3)
    trigger(sessions, settings)
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    console = client(console_settings(settings, broker_url=nowhere, redis_url=settings.broker_url), sessions)
    assert console.login() == 200

    status, page = console.post("/console/send-now", {"user": "2", "period": str(PERIOD)})

    # A page that reads as "nothing done" would have the operator ask again: a second email.
    assert status == 200
    assert "is recorded, but the broker did not take its message" in page
    assert "do not request it again" in page
    with sessions() as session:
        assert session.scalars(select(SendNowRequest.user_id)).all() == [2]
    assert "is recorded, but the broker did not take its message" in console.http.get("/console/audit").text


def test_the_preview_frame_is_the_users_report_sandboxed_and_sends_nothing(console, sessions, settings):
    assert console.login() == 200
    page = console.http.get(f"/console/preview?period={PERIOD}&user=2")
    assert 'sandbox=""' in page.text and "/console/preview/frame?period=2026-10&amp;user=2" in page.text
    frame = console.http.get(f"/console/preview/frame?period={PERIOD}&user=2")
    assert frame.status_code == 200 and "<html" in frame.text.lower()
    assert frame.headers["content-security-policy"].startswith("sandbox;")
    assert "frame-ancestors 'self'" in frame.headers["content-security-policy"]
    assert console.http.get(f"/console/preview/frame?period={PERIOD}&user=77").status_code == 404
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(PeriodRun)) == 0
    assert queued_actors(settings, "critical") == []


def test_the_preview_shows_an_inert_unsubscribe_link_which_unsubscribes_nobody(settings, sessions):
    load_users(sessions, count=3)
    # v2 shows the link in the report's body; the user's own link is their credential.
    console = client(console_settings(settings, template_version="v2"), sessions)
    assert console.login("vic", VIEWER_PASSWORD) == 200
    frame = console.http.get(f"/console/preview/frame?period={PERIOD}&user=2")
    assert set(re.findall(r"/u/[^\"'<\s]*", frame.text)) == {"/u/preview"}
    assert console.http.post("/u/preview", data={"List-Unsubscribe": "One-Click"}).status_code >= 400
    assert suppressed(sessions) == {}


def test_dead_letters_filter_by_period_reason_actor_and_text_and_page_by_keyset(console, sessions, monkeypatch):
    from reports.console import views

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    with sessions.begin() as session:
        for user_id in range(1, 6):
            dead_letters.record(
                session, report_dead(user_id, reason="permanent" if user_id % 2 else "retries_exhausted")
            )
        dead_letters.record(session, report_dead(1, period="2026-09", message_id="other-period"))
    assert console.login() == 200
    ids = lambda page: [int(i) for i in re.findall(r'/console/dead-letters/(\d+)">', page)]  # noqa: E731
    first = console.http.get("/console/dead-letters?period=2026-10&reason=permanent").text
    assert ids(first) == [5, 3] and "before=3" in first
    second = console.http.get("/console/dead-letters?period=2026-10&reason=permanent&before=3").text
    assert ids(second) == [1] and "Older" not in second
    assert ids(console.http.get("/console/dead-letters?actor=send_report_now").text) == []
    assert ids(console.http.get("/console/dead-letters?text=5.1.1&period=2026-09").text) == [6]
    bad = console.http.get("/console/dead-letters?period=2026-13")
    assert bad.status_code == 200 and "no such month" in bad.text


def test_replaying_by_filter_shows_the_count_and_replays_only_what_was_counted(console, sessions, settings):
    trigger(sessions, settings)
    with sessions.begin() as session:
        for user_id in (1, 2, 3):
            dead_letters.record(session, report_dead(user_id))
    assert console.login() == 200
    status, confirm = console.post("/console/dead-letters/replay", {"period": str(PERIOD), "reason": "permanent"})
    assert status == 200 and 'data-field="count">3<' in confirm
    up_to = re.search(r'name="up_to" value="(\d+)"', confirm)[1]
    # A letter that dies after the count was shown is not replayed by this confirmation.
    with sessions.begin() as session:
        dead_letters.record(session, report_dead(4))
    status, page = console.post(
        "/console/dead-letters/replay", {"period": str(PERIOD), "reason": "permanent", "up_to": up_to, "confirm": "1"}
    )
    assert "Replayed 3 dead letter(s)" in page
    assert queued_user_ids(settings) == {1: 1, 2: 1, 3: 1}
    with sessions() as session:
        waiting = session.scalars(select(DeadLetter.user_id).where(DeadLetter.replayed_at.is_(None))).all()
    assert waiting == [4]
    assert audit_trail(sessions)[-1] == ("ada", "replay", "dead letters period=2026-10 reason=permanent")
    # With the replayed ones shown too, the count is still only what a replay would take.
    shown = {"period": str(PERIOD), "reason": "permanent", "replayed": "1"}
    assert 'data-field="count">1<' in console.post("/console/dead-letters/replay", shown)[1]


def test_a_replay_past_the_cap_is_refused(console, sessions, settings, monkeypatch):
    from reports.console import actions

    monkeypatch.setattr(actions, "REPLAY_CAP", 2)
    with sessions.begin() as session:
        for user_id in (1, 2, 3):
            dead_letters.record(session, report_dead(user_id))
    assert console.login() == 200
    assert "more than 2 at once" in console.post("/console/dead-letters/replay", {})[1]
    page = console.post("/console/dead-letters/replay", {"up_to": "999", "confirm": "1"})[1]
    assert "narrow the filter" in page
    assert queued_user_ids(settings) == {}


def test_one_dead_letter_is_shown_and_replayed(console, sessions, settings):
    with sessions.begin() as session:
        dead_letters.record(session, report_dead(2))
        letter_id = session.scalar(select(DeadLetter.id))
    assert console.login() == 200
    page = console.http.get(f"/console/dead-letters/{letter_id}").text
    assert "MailRejected: SMTP 550: 5.1.1 No such user" in page and "Traceback" in page
    page = console.post(f"/console/dead-letters/{letter_id}/replay")[1]
    assert f"Replayed dead letter {letter_id}" in page
    assert queued_user_ids(settings) == {2: 1}
    assert "was replayed before" in console.post(f"/console/dead-letters/{letter_id}/replay")[1]
    assert queued_user_ids(settings) == {2: 1}


def test_suppressions_are_found_by_user_id_or_address(console, sessions):
    with sessions.begin() as session:
        # 0 and negative ids are users too.
        session.execute(
            text(
                "INSERT INTO users (id, email, name, active) VALUES (-5, 'minus5@example.test', 'M', true), "
                "(0, 'zero@example.test', 'Z', true)"
            )
        )
        for user_id in (-5, 0, 2, 4):
            suppressions.add(session, user_id, SuppressionReason.BOUNCED, now=utcnow(), source="smtp 550")
    assert console.login() == 200
    rows = lambda page: re.findall(r"<td>(-?\d+)</td><td>([^<]*)</td>", page)  # noqa: E731
    assert [u for u, _ in rows(console.http.get("/console/suppressions").text)] == ["-5", "0", "2", "4"]
    assert [u for u, _ in rows(console.http.get("/console/suppressions?after=-5").text)] == ["0", "2", "4"]
    for user_id in ("-5", "0", "4"):
        assert [u for u, _ in rows(console.http.get(f"/console/suppressions?q={user_id}").text)] == [user_id]
    address = rows(console.http.get("/console/suppressions?q=2").text)[0][1]
    assert [u for u, _ in rows(console.http.get(f"/console/suppressions?q={address.upper()}").text)] == ["2"]


@pytest.mark.parametrize(
    "path",
    ["/console/suppressions?q=a%00@x.test", "/console/dead-letters?text=a%00b", "/console/dead-letters?actor=a%00b"],
)
def test_a_search_holding_a_nul_is_said_to_be_refused_not_a_server_error(console, path):
    assert console.login() == 200
    answer = console.http.get(path)
    assert answer.status_code == 200 and "control character" in answer.text, answer.text[:300]


def test_the_fleet_page_shows_queue_depths_and_the_breaker(console, sessions, settings):
    assert console.login() == 200
    assert "coordinator enqueued" in console.post("/console/periods", {"period": str(PERIOD)})[1]
    page = console.http.get("/console/fleet").text
    assert re.search(r"<td>default</td><td>1</td>", page), page
    assert 'data-field="breaker" class="state-closed">closed<' in page
    assert 'data-field="unreadable"' not in page


def test_the_fleet_page_names_a_broker_it_cannot_read_and_still_shows_the_breaker(settings, sessions):
    load_users(sessions, count=2)
    # The shared Redis (the breaker, the login throttle) answers; the Redis broker does not.
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    console = client(console_settings(settings, broker_url=nowhere, redis_url=settings.broker_url), sessions)
    assert console.login() == 200

    answer = console.http.get("/console/fleet")

    assert answer.status_code == 200
    assert 'data-field="unreadable">Could not read: broker.' in answer.text
    assert 'data-field="breaker" class="state-closed">closed<' in answer.text
    assert "<td>bulk</td>" not in answer.text


def test_the_turns_to_check_a_password_belong_to_the_event_loop_that_waits_on_them(settings, sessions):
    # uvicorn runs one loop; an app served from one loop and then another (a test client, an
    # embedding) must not find the first loop's semaphore, which refuses every later wait.
    console = app.Console(
        settings=console_settings(settings),
        sessions=sessions,
        users={},
        throttle=LoginThrottle(redis.Redis.from_url(settings.shared_redis_url), settings.broker_namespace),
        templates=jinja2.Environment(autoescape=True),
    )

    async def logins_at_once() -> None:
        async def one() -> None:
            turns = console.password_turns()
            async with turns:
                await asyncio.sleep(0.01)

        await asyncio.gather(*(one() for _ in range(app.PASSWORD_CHECKS_AT_ONCE + 2)))

    asyncio.run(logins_at_once())
    asyncio.run(logins_at_once())
