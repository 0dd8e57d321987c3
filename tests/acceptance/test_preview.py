"""`reports preview`: real users' reports, as they would be sent now, written to files; nothing
sent, claimed or recorded."""

from __future__ import annotations

import email
import email.policy
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from reports.clock import utcnow
from reports.content.render import money
from reports.fanout.runs import trigger
from reports.models import Base
from reports.periods import Period
from reports.settings import DEFAULT_TEMPLATES_DIR
from tests.support.databases import load_users
from tests.support.processes import run_cli

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"


@pytest.fixture
def templated(settings, tmp_path: Path):
    """Settings whose templates are v1 and a v2 that says so in its subject."""
    templates = tmp_path / "templates"
    shutil.copytree(DEFAULT_TEMPLATES_DIR / "v1", templates / "v1")
    shutil.copytree(DEFAULT_TEMPLATES_DIR / "v1", templates / "v2")
    (templates / "v2" / "subject.txt.j2").write_text("NEW TEMPLATE {{ period.label() }}\n")
    return replace(settings, templates_dir=templates)


def snapshot(sessions, settings) -> tuple[dict[str, int], list[bytes]]:
    """Rows of every table, and the Redis keys of the test's namespace."""
    with sessions() as session:
        rows = {
            table.name: session.scalar(select(func.count()).select_from(table)) or 0
            for table in Base.metadata.sorted_tables
        }
    keys = sorted(redis.Redis.from_url(settings.broker_url).scan_iter(match=f"{settings.broker_namespace}:*"))
    return rows, keys


def read_eml(path: Path) -> email.message.EmailMessage:
    return email.message_from_bytes(path.read_bytes(), policy=email.policy.default)  # type: ignore[return-value]


def test_a_preview_writes_each_sampled_users_email_and_html_and_changes_nothing(templated, sessions, tmp_path):
    population = load_users(sessions, count=12, period=PERIOD)
    before = snapshot(sessions, templated)
    out = tmp_path / "preview"

    result = run_cli(templated, "preview", PERIOD, "--sample", "3", "--out", str(out))

    assert result.returncode == 0, result.stderr
    first = population.active[:3]
    expected = [str(out / f"{PERIOD}-{user_id}.{ext}") for user_id in first for ext in ("eml", "html")]
    assert result.stdout.splitlines() == expected
    assert sorted(p.name for p in out.iterdir()) == sorted(Path(p).name for p in expected)
    message = read_eml(out / f"{PERIOD}-{first[0]}.eml")
    assert message["To"] == f"User {first[0]} <user{first[0]}@example.test>"
    assert message["Message-ID"] == f"<report.{PERIOD}.{first[0]}@reports.test>"
    assert message["X-Report-Period"] == PERIOD
    assert message["Subject"] == "Your activity report for October 2026"
    html = message.get_body(preferencelist=("html",)).get_content()
    assert html.replace("\r\n", "\n") == (out / f"{PERIOD}-{first[0]}.html").read_text()
    # Whole lines: a bare figure (user 1 has 1 activity) would be found anywhere in the email.
    count, total = population.expected[first[0]]
    plain = message.get_body(preferencelist=("plain",)).get_content().replace("\r\n", "\n")
    assert f"Activities: {count}\n" in plain
    assert f"Total: {money(total)}\n" in plain
    assert "Previous month: 5.55\n" in plain
    assert f'<td id="total">{money(total)}</td>' in html
    assert snapshot(sessions, templated) == before


def test_the_period_s_pinned_template_is_used_unless_another_is_named(templated, sessions, tmp_path):
    load_users(sessions, count=3, period=PERIOD)
    with sessions.begin() as session:
        trigger(session, Period.parse(PERIOD), template_version="v2", now=utcnow())
    before = snapshot(sessions, templated)

    pinned = run_cli(templated, "preview", PERIOD, "--user", "2", "--out", str(tmp_path / "pinned"))
    named = run_cli(
        templated, "preview", PERIOD, "--user", "2", "--template-version", "v1", "--out", str(tmp_path / "named")
    )

    assert pinned.returncode == 0 and named.returncode == 0, (pinned.stderr, named.stderr)
    assert read_eml(tmp_path / "pinned" / f"{PERIOD}-2.eml")["Subject"] == "NEW TEMPLATE October 2026"
    assert read_eml(tmp_path / "named" / f"{PERIOD}-2.eml")["Subject"] == "Your activity report for October 2026"
    assert snapshot(sessions, templated) == before


def test_a_never_triggered_period_previews_the_template_a_trigger_would_pin(templated, sessions, tmp_path):
    load_users(sessions, count=3, period=PERIOD)
    result = run_cli(
        replace(templated, template_version="v2"),
        "preview",
        PERIOD,
        "--user",
        "1",
        "--user",
        "3",
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4
    assert read_eml(tmp_path / "out" / f"{PERIOD}-3.eml")["Subject"] == "NEW TEMPLATE October 2026"


@pytest.mark.parametrize(
    "arguments",
    [
        ("--user", "999"),  # no such user
        ("--user", "5"),  # inactive
        ("--user", "2147483648"),  # past the id column
        ("--sample", "0"),
        ("--sample", "1000000"),
        ("--user", "1", "--sample", "2"),
        ("--template-version", "v9"),
        ("--template-version", "../v1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(templated, sessions, tmp_path, arguments):
    load_users(sessions, count=6, period=PERIOD)
    before = snapshot(sessions, templated)
    out = tmp_path / "out"
    result = run_cli(templated, "preview", PERIOD, *arguments, "--out", str(out))
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()
    assert snapshot(sessions, templated) == before


@pytest.mark.parametrize("period", ["2026-13", "26-10", "october"])
def test_a_malformed_period_is_bad_input(templated, sessions, tmp_path, period):
    result = run_cli(templated, "preview", period, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_output_folder_that_cannot_be_made_is_bad_input(templated, sessions, tmp_path):
    load_users(sessions, count=3, period=PERIOD)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_cli(templated, "preview", PERIOD, "--out", str(blocker / "out"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "output folder" in result.stderr


def test_a_preview_of_a_version_without_a_languages_catalog_says_so_in_one_line(settings, sessions, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(DEFAULT_TEMPLATES_DIR / "v2", templates / "v2")
    shutil.copytree(DEFAULT_TEMPLATES_DIR / "v2", templates / "v3", ignore=shutil.ignore_patterns("locale"))
    settings = replace(settings, templates_dir=templates, template_version="v2")
    load_users(sessions, count=2, period=PERIOD)
    out = tmp_path / "preview"

    named = run_cli(settings, "preview", PERIOD, "--template-version", "v3", "--user", "1", "--out", str(out / "v3"))
    shipped = run_cli(settings, "preview", PERIOD, "--user", "1", "--out", str(out / "v2"))

    assert named.returncode == 0 and shipped.returncode == 0, (named.stderr, shipped.stderr)
    assert named.stderr.splitlines() == [
        f"warning: Template version 'v3' has no compiled catalog for de, tr, uz (in {templates / 'v3' / 'locale'}): "
        "those users' reports are worded in English, counted in reports_user_fallbacks_total"
        '{fact="catalog"}; run scripts/catalogs.'
    ]
    assert shipped.stderr == ""
    assert len(named.stdout.splitlines()) == 2
