"""One user's report, end to end on a real database and a real SMTP server."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from dataclasses import replace

import pytest
import redis
from sqlalchemy import select, text, update

from reports.clock import utcnow
from reports.content.render import money
from reports.database import sqlite_file
from reports.delivery import claims, pipeline, send_rate
from reports.delivery.mail.backend import Mailer, build_mailer
from reports.errors import InvalidRecipient, MailDeferred, ProviderUnavailable
from reports.jobs import ReportJob, SendNowJob
from reports.models import Delivery, DeliveryState, ItemState, Report, ReportItem, User
from reports.sql import server_now
from tests.integration.conftest import PERIOD, walk_everything
from tests.support.databases import load_users, pg_connect
from tests.support.processes import free_port

BCC_NAME = "Mallory\r\nBcc: attacker@example.com"
HTML_NAME = "<b>Eve</b> & co"

#: In-process sends: room for the claim and the render (tests/conftest.py says why).
pytestmark = pytest.mark.claim_lease_seconds(10)


@pytest.fixture
def context(settings, sessions, smtp_server) -> pipeline.Context:  # type: ignore[no-untyped-def]
    mail_settings = replace(settings, smtp_url=smtp_server.url)
    return pipeline.Context(settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings))


@pytest.fixture
def population(settings, sessions):  # type: ignore[no-untyped-def]
    """Ten users (5 and 10 inactive), two with hostile names, all planned for the period."""
    loaded = load_users(sessions, count=10, names={2: HTML_NAME, 6: BCC_NAME})
    walk_everything(sessions, settings)
    return loaded


def job(settings, user_id: int) -> ReportJob:  # type: ignore[no-untyped-def]
    return ReportJob(PERIOD, user_id, settings.template_version)


def item_state(sessions, user_id: int) -> str:  # type: ignore[no-untyped-def]
    with sessions() as session:
        item = session.get(ReportItem, (str(PERIOD), user_id))
        assert item is not None
        return item.state


def test_a_report_is_emailed_once_with_the_contract_headers_and_the_right_figures(
    settings, sessions, context, smtp_server, population
):
    user_id = 7
    count, total = population.expected[user_id]
    assert count == 3

    outcome = pipeline.run(context, job(settings, user_id))

    assert outcome == pipeline.Outcome.DELIVERED
    assert len(smtp_server.handler.messages) == 1
    envelope, message = smtp_server.handler.messages[0]
    assert envelope == [f"user{user_id}@example.test"]
    assert [a.addr_spec for a in message["To"].addresses] == [f"user{user_id}@example.test"]
    assert message["Message-ID"] == f"<report.{PERIOD}.{user_id}@reports.test>"
    assert message["X-Report-Period"] == str(PERIOD)
    assert message["X-Report-User-Id"] == str(user_id)
    assert message.get_content_type() == "multipart/alternative"
    assert "October 2026" in message["Subject"]

    plain = message.get_body(("plain",)).get_content().replace("\r\n", "\n")
    html = message.get_body(("html",)).get_content()
    assert f"Activities: {count}\n" in plain
    assert f"Total: {money(total)}\n" in plain
    assert "Previous month: 5.55\n" in plain
    assert f"Change: +{money(total - 555)}" in plain
    assert "7.77" not in plain, "an activity of the next month was counted"
    assert f'<td id="count">{count}</td>' in html
    assert f'<td id="total">{money(total)}</td>' in html

    with sessions() as session:
        report = session.get(Report, (str(PERIOD), user_id))
        assert report is not None
        assert report.subject == message["Subject"]
        assert f"Total: {money(total)}" in report.body_text
        assert f'<td id="total">{money(total)}</td>' in report.body_html
        assert report.template_version == settings.template_version
        sent = session.get(Delivery, (str(PERIOD), user_id))
        assert sent is not None and sent.state == DeliveryState.SENT
    assert item_state(sessions, user_id) == ItemState.DELIVERED


def test_running_the_same_job_again_sends_nothing(settings, sessions, context, smtp_server, population):
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED

    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.ALREADY_DONE

    assert len(smtp_server.messages) == 1
    assert item_state(sessions, 3) == ItemState.DELIVERED


def test_a_job_whose_item_was_reopened_after_sending_still_sends_nothing(
    settings, sessions, context, smtp_server, population
):
    """A copy that finds the item pending but the delivery sent must not send again."""
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED
    with sessions.begin() as session:
        session.execute(text("UPDATE report_items SET state = 'pending' WHERE user_id = 3"))

    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.ALREADY_DONE

    assert len(smtp_server.messages) == 1
    assert item_state(sessions, 3) == ItemState.DELIVERED


def run_concurrently(context: pipeline.Context, report_job: ReportJob, copies: int) -> list[object]:
    """Run ``copies`` copies of one job in threads released together; each one's outcome or error."""
    barrier = threading.Barrier(copies)
    results: list[object] = []
    lock = threading.Lock()

    def work() -> None:
        try:
            barrier.wait(timeout=10)
            result: object = pipeline.run(context, report_job)
        except Exception as e:  # noqa: BLE001 - judged by the test
            result = e
        with lock:
            results.append(result)

    threads = [threading.Thread(target=work) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return results


#: Users whose job is raced, one round each: more rounds make a timing-dependent fault show reliably.
RACED_USERS = (1, 3, 7)


def test_the_same_job_run_by_four_workers_at_once_sends_one_email(settings, sessions, context, smtp_server, population):
    for user_id in RACED_USERS:
        results = run_concurrently(context, job(settings, user_id), copies=4)

        unexpected = [r for r in results if not isinstance(r, pipeline.Outcome)]
        assert unexpected == [], f"user {user_id}: a copy failed instead of returning its outcome"
        assert results.count(pipeline.Outcome.DELIVERED) == 1, results
        others = [r for r in results if r != pipeline.Outcome.DELIVERED]
        assert all(r == pipeline.Outcome.ALREADY_DONE or r.is_deferred for r in others), results
        assert len(smtp_server.by_user()[user_id]) == 1
        assert item_state(sessions, user_id) == ItemState.DELIVERED
        with sessions() as session:
            claim = session.get(Delivery, (str(PERIOD), user_id))
            assert claim is not None and claim.state == DeliveryState.SENT
    assert len(smtp_server.messages) == len(RACED_USERS)


def test_copies_that_raced_and_are_retried_after_the_lease_send_no_second_email(
    settings, sessions, context, smtp_server, population
):
    # Which copy loses a race is up to the database: race every active user to see each case.
    raced = population.active
    for user_id in raced:
        run_concurrently(context, job(settings, user_id), copies=4)
    assert sorted(smtp_server.by_user()) == raced

    # The retry of every copy that did not finish (one deferred by ClaimHeld, or one that failed),
    # once the claim's lease has run out (on the database's clock, the one it was written on).
    with sessions.begin() as session:
        session.execute(update(Delivery).values(lease_expires_at=server_now(-1)))
    outcomes = {user_id: pipeline.run(context, job(settings, user_id)) for user_id in raced}

    received = {user_id: len(messages) for user_id, messages in smtp_server.by_user().items()}
    assert received == dict.fromkeys(raced, 1), "a user received the same report twice"
    assert outcomes == dict.fromkeys(raced, pipeline.Outcome.ALREADY_DONE)
    assert all(item_state(sessions, user_id) == ItemState.DELIVERED for user_id in raced)


def test_an_inactive_user_is_skipped_without_an_email(settings, sessions, context, smtp_server, population):
    user_id = 3
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET active = :no WHERE id = :id"), {"no": False, "id": user_id})

    assert pipeline.run(context, job(settings, user_id)) == pipeline.Outcome.SKIPPED

    assert smtp_server.messages == []
    assert item_state(sessions, user_id) == ItemState.SKIPPED


def test_a_deleted_user_is_skipped_without_an_email(settings, sessions, context, smtp_server, population):
    user_id = 4
    with sessions.begin() as session:
        session.execute(text("DELETE FROM activities WHERE user_id = :id"), {"id": user_id})
        session.execute(text("DELETE FROM users WHERE id = :id"), {"id": user_id})

    assert pipeline.run(context, job(settings, user_id)) == pipeline.Outcome.SKIPPED

    assert smtp_server.messages == []
    assert item_state(sessions, user_id) == ItemState.SKIPPED


def test_the_email_goes_to_the_address_the_user_has_when_the_job_runs(
    settings, sessions, context, smtp_server, population
):
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'moved@example.test' WHERE id = 3"))

    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED

    envelope, message = smtp_server.handler.messages[0]
    assert envelope == ["moved@example.test"]
    assert [a.addr_spec for a in message["To"].addresses] == ["moved@example.test"]


def test_html_in_a_name_is_escaped_in_the_html_part(settings, sessions, context, smtp_server, population):
    assert pipeline.run(context, job(settings, 2)) == pipeline.Outcome.DELIVERED

    [message] = smtp_server.messages
    html = message.get_body(("html",)).get_content()
    assert "&lt;b&gt;Eve&lt;/b&gt; &amp; co" in html
    assert "<b>Eve</b>" not in html
    assert "<b>" not in html


def test_a_line_break_in_a_name_cannot_inject_a_bcc_header(settings, sessions, context, smtp_server, population):
    assert pipeline.run(context, job(settings, 6)) == pipeline.Outcome.DELIVERED

    [(envelope, message)] = smtp_server.handler.messages
    assert envelope == ["user6@example.test"]
    assert message["Bcc"] is None
    assert [a.addr_spec for a in message["To"].addresses] == ["user6@example.test"]
    assert all("attacker" not in recipient for recipient in envelope)
    header_block = message.as_string().split("\n\n", 1)[0]
    assert not any(line.lower().startswith("bcc:") for line in header_block.splitlines())


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("=?utf-8?q?Eve=0D=0ABcc:_attacker@example.com?=", id="encoded-word-bcc"),
        pytest.param("=?utf-8?q?Eve=0D=0A=0D=0AYour_account_is_closed.?=", id="encoded-word-replaces-body"),
    ],
)
def test_an_encoded_line_break_in_a_name_adds_no_header_and_leaves_the_body_alone(
    settings, sessions, context, smtp_server, population, name
):
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET name = :name WHERE id = 3"), {"name": name})

    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED

    [(envelope, message)] = smtp_server.handler.messages
    assert envelope == ["user3@example.test"]
    assert message.keys() == [
        "From",
        "To",
        "Subject",
        "Date",
        "Message-ID",
        "X-Report-Period",
        "X-Report-User-Id",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
        "MIME-Version",
        "Content-Type",
    ]
    assert message["Bcc"] is None
    assert [a.addr_spec for a in message["To"].addresses] == ["user3@example.test"]
    assert "\n" not in message["To"].addresses[0].display_name
    count, total = population.expected[3]
    plain = message.get_body(("plain",)).get_content()
    assert f"Activities: {count}" in plain and f"Total: {money(total)}" in plain
    assert "Your account is closed" not in message.as_string()


def test_an_invalid_email_address_is_a_permanent_failure_that_sends_nothing_and_holds_nothing(
    settings, sessions, context, smtp_server, population
):
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'not an address' WHERE id = 3"))

    with pytest.raises(InvalidRecipient):
        pipeline.run(context, job(settings, 3))

    assert smtp_server.messages == []
    assert item_state(sessions, 3) == ItemState.PENDING
    # The address fixed and the message replayed well inside the 10 s lease: the claim taken before
    # the email was built was given back, so the replay sends at once.
    with sessions.begin() as session:
        session.execute(text("UPDATE users SET email = 'fixed3@example.test' WHERE id = 3"))
    assert pipeline.run(context, job(settings, 3)) == pipeline.Outcome.DELIVERED
    assert [envelope for envelope, _ in smtp_server.handler.messages] == [["fixed3@example.test"]]
    assert item_state(sessions, 3) == ItemState.DELIVERED


def test_an_unreachable_provider_is_transient_and_releases_the_claim(
    settings, sessions, context, smtp_server, population
):
    down_settings = replace(settings, smtp_url=f"smtp://127.0.0.1:{free_port()}")
    down = replace(context, settings=down_settings, mailer=build_mailer(down_settings))

    with pytest.raises(ProviderUnavailable):
        pipeline.run(down, job(settings, 7))

    assert smtp_server.messages == []
    assert item_state(sessions, 7) == ItemState.PENDING
    with sessions() as session:
        claim = session.get(Delivery, (str(PERIOD), 7))
        assert claim is not None and claim.state == DeliveryState.CLAIMED

    # Well inside the 10 s lease: the retry must not have to wait it out.
    assert pipeline.run(context, job(settings, 7)) == pipeline.Outcome.DELIVERED
    assert len(smtp_server.messages) == 1
    assert smtp_server.by_user() == {7: smtp_server.messages}
    assert item_state(sessions, 7) == ItemState.DELIVERED


def test_a_v2_report_goes_through_the_pipeline_with_its_currency_and_chart(settings, sessions, smtp_server):
    """The default template version, end to end: rendered, stored and sent as both parts."""
    settings = replace(settings, template_version="v2", smtp_url=smtp_server.url)
    context = pipeline.Context(settings=settings, sessions=sessions, mailer=build_mailer(settings))
    population = load_users(sessions, count=3, names={2: HTML_NAME})
    walk_everything(sessions, settings)
    _, total = population.expected[2]

    assert pipeline.run(context, ReportJob(PERIOD, 2, "v2")) == pipeline.Outcome.DELIVERED

    [(_, message)] = smtp_server.handler.messages
    plain = message.get_body(("plain",)).get_content().replace("\r\n", "\n")
    html = message.get_body(("html",)).get_content()
    assert f"Total spent   ${money(total)}\n" in plain
    assert '<p class="kpi-total"' in html and f"${money(total)}</p>" in html
    assert "&lt;b&gt;Eve&lt;/b&gt; &amp; co" in html and "<b>Eve</b>" not in html
    assert 'class="bar"' in html


def test_a_month_without_activity_is_skipped_when_the_setting_says_so(settings, sessions, smtp_server, population):
    # load_users gives user i (i % 4) activities in the period: users 4 and 8 have none.
    quiet, busy = 4, 7
    skipping = replace(settings, smtp_url=smtp_server.url, report_empty_month="skip")
    context = pipeline.Context(settings=skipping, sessions=sessions, mailer=build_mailer(skipping))

    assert pipeline.run(context, job(settings, quiet)) == pipeline.Outcome.SKIPPED
    assert pipeline.run(context, job(settings, busy)) == pipeline.Outcome.DELIVERED

    assert sorted(smtp_server.by_user()) == [busy]
    assert (item_state(sessions, quiet), item_state(sessions, busy)) == (ItemState.SKIPPED, ItemState.DELIVERED)


def test_a_send_past_the_fleets_rate_is_deferred_and_gives_its_claim_back(
    settings, sessions, smtp_server, population, redis_url, broker_namespace
):
    mail_settings = replace(settings, smtp_url=smtp_server.url)
    limiter = send_rate.build(redis.Redis.from_url(redis_url), namespace=broker_namespace, per_second=0.1, burst=1)
    context = pipeline.Context(
        settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings), send_rate=limiter
    )

    assert pipeline.run(context, job(settings, 1)) == pipeline.Outcome.DELIVERED
    # The next slot is ten seconds away: deferred, without a retry spent, and nothing held meanwhile.
    throttled = pipeline.run(context, job(settings, 2))
    assert throttled.is_deferred and 9 < throttled.delay_seconds <= 10, throttled

    assert sorted(smtp_server.by_user()) == [1]
    assert item_state(sessions, 2) == ItemState.PENDING
    with sessions() as session:
        claim = session.scalars(select(Delivery).where(Delivery.user_id == 2)).one()
        assert claim.state == DeliveryState.CLAIMED and claim.lease_expires_at <= utcnow()


def test_an_email_refused_for_the_pace_time_after_time_while_others_go_is_retried_and_cuts_the_rate_no_more(
    settings, sessions, smtp_server, population, redis_url, broker_namespace
):
    # A recipient's own policy answering 4.7.1 looks like the provider's pace; the fleet sends on.
    smtp_server.handler.rcpt_fault = lambda address: (
        f"450 4.7.1 <{address}>: Recipient address rejected: Access denied" if address == "user3@example.test" else None
    )
    mail_settings = replace(settings, smtp_url=smtp_server.url)
    client = redis.Redis.from_url(redis_url)
    limiter = send_rate.build(client, namespace=broker_namespace, per_second=None, burst=1, follow_provider=True)
    context = pipeline.Context(
        settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings), send_rate=limiter
    )

    def rate() -> bytes | None:
        return client.hget(send_rate.adapted_rate_key(broker_namespace), "per_second")

    others = iter((1, 2, 4, 6, 7, 8, 9))
    for _ in range(send_rate.PACE_REFUSALS_PER_EMAIL):
        assert pipeline.run(context, job(settings, 3)).is_deferred  # taken as the pace: no retry spent
        assert pipeline.run(context, job(settings, next(others))) == pipeline.Outcome.DELIVERED
    cut_to = rate()
    assert cut_to is not None, "refusals for the pace did not cut the rate"

    # Past that, the same email's refusal is its own: a retry (and in the end a dead letter), no cut.
    for _ in range(2):
        with pytest.raises(MailDeferred):
            pipeline.run(context, job(settings, 3))
        assert pipeline.run(context, job(settings, next(others))) == pipeline.Outcome.DELIVERED
    # Only raised since, by the sends that went: a cut would have brought it below.
    after = rate()
    assert after is not None and float(after) >= float(cut_to)

    assert 3 not in smtp_server.by_user()
    assert item_state(sessions, 3) == ItemState.PENDING


def test_a_copy_of_a_send_now_that_went_out_keeps_the_report_that_was_mailed(
    settings, sessions, context, smtp_server, population
):
    request_id = str(uuid.uuid4())
    with sessions.begin() as session:
        claims.record_send_now_request(
            session, request_id, PERIOD, 2, message_id="<r>", template_version=settings.template_version, now=utcnow()
        )
    job = SendNowJob(PERIOD, 2, request_id, settings.template_version)
    assert pipeline.send_now(context, job) == pipeline.Outcome.DELIVERED
    with sessions.begin() as session:
        session.execute(update(User).where(User.id == 2).values(name="Renamed Since"))

    # A redelivered copy finds the request served: nothing sent, and nothing rendered over the report kept.
    assert pipeline.send_now(context, job) == pipeline.Outcome.ALREADY_DONE

    [mailed] = smtp_server.messages
    with sessions() as session:
        kept = session.scalars(select(Report.body_text).where(Report.period == str(PERIOD), Report.user_id == 2)).one()
    assert "Renamed Since" not in kept
    assert kept.replace("\r\n", "\n") == mailed.get_body(("plain",)).get_content().replace("\r\n", "\n")


class _WatchingMailer:
    """The SMTP mailer, looking first at whether any session holds a transaction open on the database."""

    def __init__(self, inner: Mailer, database_url: str) -> None:
        self.inner, self.database_url = inner, database_url
        self.open_at_send: list[int] = []

    def send(self, message: bytes, *, recipient: str) -> None:
        self.open_at_send.append(_open_transactions(self.database_url))
        self.inner.send(message, recipient=recipient)


def _open_transactions(database_url: str) -> int:
    path = sqlite_file(database_url)
    if path is not None:
        # A write transaction holds SQLite's one write lock: taking it without waiting fails while one is open.
        probe = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return 0
        except sqlite3.OperationalError:
            return 1
        finally:
            probe.close()
    with pg_connect(database_url) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND xact_start IS NOT NULL"
        ).fetchone()
        return int(row[0]) if row else 0


def test_no_transaction_is_open_on_the_database_while_the_email_goes_out(
    settings, sessions, context, smtp_server, population
):
    watching = _WatchingMailer(context.mailer, settings.database_url)
    watched = replace(context, mailer=watching)

    for user_id in (1, 2, 3):
        assert pipeline.run(watched, job(settings, user_id)) == pipeline.Outcome.DELIVERED

    assert sorted(smtp_server.by_user()) == [1, 2, 3]
    assert watching.open_at_send == [0, 0, 0]
    # The look sees one that is open.
    with sessions.begin() as session:
        session.execute(update(ReportItem).where(ReportItem.user_id == 9).values(attempts=0))
        assert _open_transactions(settings.database_url) == 1


class _CuttingMailer:
    """The SMTP mailer that, as it sends, ends every other session on the database, the message's own too."""

    def __init__(self, inner: Mailer, database_url: str) -> None:
        self.inner, self.database_url = inner, database_url

    def send(self, message: bytes, *, recipient: str) -> None:
        with pg_connect(self.database_url) as admin:
            ended = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert ended and ended[0] >= 1
        self.inner.send(message, recipient=recipient)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_send_whose_connection_died_during_it_is_recorded_on_a_new_one_and_never_sent_again(
    settings, sessions, context, smtp_server, population
):
    cutting = replace(context, mailer=_CuttingMailer(context.mailer, settings.database_url))

    assert pipeline.run(cutting, job(settings, 7)) == pipeline.Outcome.DELIVERED

    assert item_state(sessions, 7) == ItemState.DELIVERED
    assert pipeline.run(context, job(settings, 7)) == pipeline.Outcome.ALREADY_DONE
    assert smtp_server.by_user() == {7: smtp_server.messages}
    assert len(smtp_server.messages) == 1
