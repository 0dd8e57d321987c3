"""Each user's report in their own language, mailed by real workers: the words from the shipped
catalog, the numbers, money and month names from the same locale, and an unknown or unshipped
locale written in REPORT_LOCALE's language and counted; a template version that lacks a language's
catalog said at start, and its reports in that language worded in English and counted."""

from __future__ import annotations

import shutil
from dataclasses import replace
from email.message import EmailMessage
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from reports.counters import FALLBACKS_COUNTER, counter_key
from reports.settings import DEFAULT_TEMPLATES_DIR
from tests.acceptance.test_failures import assert_each_mailed_once, trigger, wait_complete
from tests.support.databases import load_users
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

#: Each user's stored locale (users 5 and 6 have none that ships; user 7 has none at all).
LOCALES = {1: "tr", 2: "uz-Latn", 3: "de-AT", 4: "en-GB", 5: "xx-Unknown", 6: "fr", 7: None}


def plain(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return body.get_content().replace("\xa0", " ")


def subject(message: EmailMessage) -> str:
    return str(message["Subject"]).replace("\xa0", " ")


def load_users_with_locales(sessions, locales: dict[int, str | None]):
    """Users with these locales, each with one activity of 1,234.56 in October 2026 and nothing in September."""
    population = load_users(sessions, count=len(locales), inactive_every=100)
    with sessions.begin() as session:
        session.execute(text("DELETE FROM activities"))
        for user_id, locale in locales.items():
            session.execute(text("UPDATE users SET locale = :locale WHERE id = :id"), {"locale": locale, "id": user_id})
            session.execute(
                text(
                    "INSERT INTO activities (id, user_id, occurred_at, category, amount_cents)"
                    " VALUES (:id, :id, '2026-10-15 12:00:00', 'food', 123456)"
                ),
                {"id": user_id},
            )
    return population


def test_each_user_is_mailed_in_their_language_and_unknown_locales_fall_back_and_are_counted(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, template_version="v2")
    population = load_users_with_locales(sessions, LOCALES)
    workers = start_workers(settings, processes=1, threads=4)
    # The shipped version has every shipped language's catalog: nothing to say at start.
    assert "no compiled catalog" not in workers.log()

    trigger(settings)
    wait_complete(sessions, timeout=60)

    assert_each_mailed_once(smtp_server, population.active)
    mail = {user_id: messages[0] for user_id, messages in smtp_server.by_user().items()}
    assert subject(mail[1]) == "Ekim 2026 raporunuz: $1.234,56 harcama"
    assert "Merhaba User 1," in plain(mail[1]) and "Toplam harcama   $1.234,56" in plain(mail[1])
    assert subject(mail[2]) == "Oktabr 2026 hisobotingiz: 1 234,56 US$ sarflandi"
    assert "Hurmatli User 2," in plain(mail[2]) and "Toifalar boʻyicha" in plain(mail[2])
    assert subject(mail[3]) == "Ihr Bericht für Oktober 2026: $ 1.234,56 ausgegeben"
    assert subject(mail[4]) == "Your October 2026 report: US$1,234.56 spent"
    for fallen_back in (5, 6, 7):
        assert subject(mail[fallen_back]) == "Your October 2026 report: $1,234.56 spent", fallen_back
    html = {user_id: message.get_body(("html",)).get_content() for user_id, message in mail.items()}  # type: ignore[union-attr]
    assert '<html lang="tr">' in html[1] and '<html lang="uz-Latn">' in html[2] and '<html lang="en">' in html[5]

    # Two users' locales are not shipped (user 7 has none, which is no fallback).
    client = redis.Redis.from_url(settings.shared_redis_url)
    key = counter_key(settings.broker_namespace, FALLBACKS_COUNTER)
    wait_until(lambda: client.hget(key, "locale") == b"2", timeout=10, what="two locale fallbacks counted")


def test_a_version_without_a_languages_catalog_is_said_at_start_and_its_reports_are_english_and_counted(
    settings, sessions, smtp_server, start_workers, tmp_path: Path
):
    # v3: v2's templates, its catalogs not made yet.
    templates = tmp_path / "templates"
    shutil.copytree(DEFAULT_TEMPLATES_DIR / "v2", templates / "v2")
    shutil.copytree(DEFAULT_TEMPLATES_DIR / "v2", templates / "v3", ignore=shutil.ignore_patterns("locale"))
    settings = replace(settings, smtp_url=smtp_server.url, templates_dir=templates, template_version="v3")
    population = load_users_with_locales(sessions, {1: "tr", 2: None})
    workers = start_workers(settings, processes=1, threads=2)

    said = [line for line in workers.log().splitlines() if "no compiled catalog" in line]
    assert len(said) == 1 and "WARNING" in said[0], workers.log()
    assert "Template version 'v3' has no compiled catalog for de, tr, uz " in said[0]

    trigger(settings)
    wait_complete(sessions, timeout=60)

    assert_each_mailed_once(smtp_server, population.active)
    mail = {user_id: messages[0] for user_id, messages in smtp_server.by_user().items()}
    # English words, Turkish numbers and months; the HTML part says the language of its words.
    assert subject(mail[1]) == "Your Ekim 2026 report: $1.234,56 spent"
    assert '<html lang="en">' in mail[1].get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert subject(mail[2]) == "Your October 2026 report: $1,234.56 spent"
    client = redis.Redis.from_url(settings.shared_redis_url)
    key = counter_key(settings.broker_namespace, FALLBACKS_COUNTER)
    wait_until(lambda: client.hget(key, "catalog") == b"1", timeout=10, what="one catalog fallback counted")
    assert client.hget(key, "locale") is None
