"""``reports dlq``: the dead letters as an operator's work list, driven through the real command.

Dead letters are put in the store directly (as the workers' sink does), so these run without
workers; the replay's messages are looked for in Redis.
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from reports import suppressions
from reports.dead_message import DeadMessage
from reports.failures import dead_letters
from reports.models import SuppressionReason
from tests.support.broker import queued_messages
from tests.support.databases import load_users
from tests.support.processes import run_cli

pytestmark = pytest.mark.acceptance

FIELDS = {
    "id",
    "message_id",
    "actor",
    "queue",
    "period",
    "user_id",
    "attempts",
    "reason",
    "error_class",
    "error_message",
    "first_failed_at",
    "died_at",
    "replayed_at",
}


def dead(
    message_id: str,
    *,
    period: str | None = "2026-10",
    user_id: int | None = 1,
    actor: str = "build_report",
    reason: str = "permanent",
    error_class: str = "MailRejected",
    error_message: str = "SMTP 550: 5.1.1 No such user",
    attempts: int = 1,
    died_ago: timedelta = timedelta(minutes=1),
) -> DeadMessage:
    died_ms = int((time.time() - died_ago.total_seconds()) * 1000)
    args: tuple[Any, ...] = () if period is None else (period, user_id, "v1")
    return DeadMessage(
        message_id=message_id,
        actor=actor,
        queue="bulk",
        args=args,
        kwargs={},
        attempts=attempts,
        reason=reason,
        error_class=error_class,
        error_message=error_message,
        traceback=f"Traceback (most recent call last):\n  ...\nreports.errors.{error_class}: {error_message}\n",
        first_failed_ms=died_ms - 30_000,
        died_ms=died_ms,
    )


def store(sessions, *messages: DeadMessage) -> None:
    with sessions.begin() as session:
        for message in messages:
            assert dead_letters.record(session, message)


def dlq(settings, *args: str) -> Any:
    result = run_cli(settings, "dlq", *args)
    assert result.returncode == 0, result.stderr
    return result


def run_all(settings, commands: list[tuple[str, ...]]) -> list[subprocess.CompletedProcess[str]]:
    """Run several ``reports dlq`` commands side by side (each in a process of its own), in order."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda args: run_cli(settings, "dlq", *args), commands))


def listed(settings, *args: str) -> list[dict[str, Any]]:
    return json.loads(dlq(settings, "list", "--json", *args).stdout)


def namespace_keys(settings) -> list[bytes]:
    return redis.Redis.from_url(settings.broker_url).keys(f"{settings.broker_namespace}:*")


def utc(ms: int) -> datetime:
    """Milliseconds since the epoch as the naive UTC datetime the store keeps."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def seconds(iso: str) -> datetime:
    assert iso.endswith("Z"), iso
    return datetime.fromisoformat(iso.removesuffix("Z"))


@pytest.fixture
def four_letters(sessions) -> list[DeadMessage]:
    """Two bounces in 2026-10, an exhausted deferral in 2026-09, and a message for an unknown actor."""
    letters = [
        dead("m-bounce-1", user_id=1, died_ago=timedelta(minutes=3)),
        dead(
            "m-deferred-2",
            period="2026-09",
            user_id=2,
            reason="retries_exhausted",
            error_class="MailDeferred",
            error_message="SMTP 451: 4.7.1 Try again later",
            attempts=6,
            died_ago=timedelta(minutes=2),
        ),
        dead(
            "m-invalid-3",
            user_id=3,
            error_class="InvalidRecipient",
            error_message="The user's email address is not a valid address.",
        ),
        dead(
            "m-unknown-actor",
            period=None,
            user_id=None,
            actor="no_such_actor",
            reason="broker",
            error_class="BrokerDeadLetter",
            error_message="Dead-lettered by Dramatiq itself.",
        ),
    ]
    store(sessions, *letters)
    return letters


def test_list_json_gives_every_field_oldest_first(settings, four_letters):
    rows = listed(settings)

    assert [row["message_id"] for row in rows] == [m.message_id for m in four_letters]
    assert all(set(row) == FIELDS for row in rows), rows
    assert [row["id"] for row in rows] == sorted(row["id"] for row in rows)
    first = rows[0]
    expected = four_letters[0]
    assert {k: first[k] for k in FIELDS - {"id", "first_failed_at", "died_at"}} == {
        "message_id": "m-bounce-1",
        "actor": "build_report",
        "queue": "bulk",
        "period": "2026-10",
        "user_id": 1,
        "attempts": 1,
        "reason": "permanent",
        "error_class": "MailRejected",
        "error_message": "SMTP 550: 5.1.1 No such user",
        "replayed_at": None,
    }
    assert abs((seconds(first["died_at"]) - utc(expected.died_ms)).total_seconds()) <= 1
    assert abs((seconds(first["first_failed_at"]) - utc(expected.first_failed_ms)).total_seconds()) <= 1
    assert (rows[1]["period"], rows[1]["attempts"], rows[1]["reason"]) == ("2026-09", 6, "retries_exhausted")
    assert (rows[3]["actor"], rows[3]["period"], rows[3]["user_id"]) == ("no_such_actor", None, None)

    table = dlq(settings, "list").stdout
    assert "4 dead letter(s)." in table


def test_the_table_names_user_0_as_a_user(settings, sessions):
    store(sessions, dead("zero", user_id=0), dead("none", period=None, user_id=None))
    table = dlq(settings, "list").stdout
    assert "2026-10  user 0  " in table and "-  user -  " in table


def test_list_filters_by_period_and_by_reason_text(settings, four_letters):
    filters = [
        ("--period", "2026-10"),
        ("--period", "2026-09"),
        ("--period", "2026-08"),
        ("--reason", "550"),
        ("--reason", "invalidrecipient"),
        ("--reason", "retries_exhausted"),
        ("--period", "2026-10", "--reason", "permanent"),
    ]
    results = run_all(settings, [("list", "--json", *args) for args in filters])

    assert all(result.returncode == 0 for result in results), [result.stderr for result in results]
    found = {
        args: [row["message_id"] for row in json.loads(result.stdout)]
        for args, result in zip(filters, results, strict=True)
    }
    assert found == {
        ("--period", "2026-10"): ["m-bounce-1", "m-invalid-3"],
        ("--period", "2026-09"): ["m-deferred-2"],
        ("--period", "2026-08"): [],
        ("--reason", "550"): ["m-bounce-1"],
        ("--reason", "invalidrecipient"): ["m-invalid-3"],
        ("--reason", "retries_exhausted"): ["m-deferred-2"],
        ("--period", "2026-10", "--reason", "permanent"): ["m-bounce-1", "m-invalid-3"],
    }


def test_show_prints_one_dead_letter_with_its_payload_and_traceback(settings, four_letters):
    [row] = listed(settings, "--reason", "451")

    shown = json.loads(dlq(settings, "show", str(row["id"])).stdout)

    assert {k: shown[k] for k in FIELDS} == row
    assert shown["payload"] == {"args": ["2026-09", 2, "v1"], "kwargs": {}}
    assert shown["traceback"].startswith("Traceback (most recent call last):")
    assert "MailDeferred: SMTP 451" in shown["traceback"]


def test_bad_input_exits_2_with_one_line_on_stderr_and_changes_nothing(settings, sessions, four_letters):
    known = str(listed(settings)[0]["id"])
    before = listed(settings, "--replayed")
    bad = [
        ("replay",),
        ("replay", "--id", known, "--all"),
        ("replay", "--id", known, "--period", "2026-10"),
        ("replay", "--period", "2026-10", "--all"),
        ("replay", "--id", "99999"),
        ("replay", "--id", known, "--id", "99999"),
        ("replay", "--period", "2026-13"),
        ("show", "99999"),
        ("purge",),
        ("purge", "--older-than", "-1"),
        ("list", "--period", "bad"),
    ]
    for args, result in zip(bad, run_all(settings, bad), strict=True):
        assert result.returncode == 2, (args, result.returncode, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].strip(), (args, result.stderr)
        assert "Traceback" not in result.stderr, args

    assert listed(settings, "--replayed") == before
    assert namespace_keys(settings) == []


def test_replay_dry_run_lists_what_it_would_replay_and_changes_nothing(settings, four_letters):
    october = listed(settings, "--period", "2026-10")

    dry = dlq(settings, "replay", "--period", "2026-10", "--dry-run").stdout

    assert f"Would replay 2 dead letter(s): {october[0]['id']}, {october[1]['id']}" in dry
    assert listed(settings, "--period", "2026-10") == october
    assert all(row["replayed_at"] is None for row in listed(settings, "--replayed"))
    assert namespace_keys(settings) == []

    # The same replay for real: both enqueued once, marked replayed, gone from the work list.
    real = dlq(settings, "replay", "--period", "2026-10").stdout
    assert "Replayed 2 dead letter(s)" in real
    assert queued_messages(settings.broker_url, settings.broker_namespace, "bulk") == 2
    assert [row["message_id"] for row in listed(settings)] == ["m-deferred-2", "m-unknown-actor"]
    replayed = [row for row in listed(settings, "--replayed") if row["replayed_at"]]
    assert [row["id"] for row in replayed] == [row["id"] for row in october]


def test_a_replay_names_the_users_on_the_suppression_list_whose_reports_it_will_skip(settings, sessions, four_letters):
    # User 1's 550 suppressed them as bounced: fixing the address is not enough, and the replay says so.
    load_users(sessions, count=3)
    with sessions.begin() as session:
        suppressions.add(session, 1, SuppressionReason.BOUNCED, now=datetime(2026, 11, 1), source="test")

    dry = dlq(settings, "replay", "--period", "2026-10", "--dry-run")
    real = dlq(settings, "replay", "--period", "2026-10")

    for result in (dry, real):
        assert result.stderr.splitlines() == [
            "note: 1 of these users are on the suppression list (1): their reports are skipped, not sent. "
            "`reports suppress remove USER` first if their address is fixed."
        ]


def test_purge_removes_dead_letters_older_than_the_given_days(settings, sessions):
    store(
        sessions,
        dead("m-old", died_ago=timedelta(days=10)),
        dead("m-recent", user_id=2, died_ago=timedelta(days=2)),
        dead("m-now", user_id=3, died_ago=timedelta(seconds=2)),
    )

    purged = dlq(settings, "purge", "--older-than", "5").stdout
    assert "Purged 1 dead letter(s)" in purged
    assert [row["message_id"] for row in listed(settings, "--replayed")] == ["m-recent", "m-now"]

    purged = dlq(settings, "purge", "--older-than", "0").stdout
    assert "Purged 2 dead letter(s)" in purged
    assert listed(settings, "--replayed") == []
