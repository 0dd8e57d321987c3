"""`reports suppress add|remove|list` as an operator runs it, bad input included."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import text

from tests.support.databases import load_users
from tests.support.processes import run_cli

pytestmark = pytest.mark.acceptance


def rows(sessions) -> dict[int, str]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        return dict(session.execute(text("SELECT user_id, reason FROM suppressions")).all())


def test_an_operator_adds_lists_and_removes_a_complaint(settings, sessions):
    load_users(sessions, count=3)

    added = run_cli(settings, "suppress", "add", "2", "--reason", "complained")
    assert added.returncode == 0, added.stderr
    assert rows(sessions) == {2: "complained"}
    again = run_cli(settings, "suppress", "add", "2", "--reason", "unsubscribed")
    assert again.returncode == 0 and "already suppressed (complained)" in again.stdout
    listed = run_cli(settings, "suppress", "list", "--json")
    assert [(r["user_id"], r["reason"], r["source"]) for r in json.loads(listed.stdout)] == [(2, "complained", "cli")]
    # UTC to the second with a Z, as every other command's JSON times.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", json.loads(listed.stdout)[0]["created_at"])
    assert json.loads(run_cli(settings, "suppress", "list", "--reason", "bounced", "--json").stdout) == []

    removed = run_cli(settings, "suppress", "remove", "2")
    assert removed.returncode == 0 and rows(sessions) == {}


@pytest.mark.parametrize(
    "args",
    [
        ("add", "2"),  # no reason
        ("add", "2", "--reason", "spam"),  # not a reason
        ("add", "0", "--reason", "complained"),
        ("add", "99999999999", "--reason", "complained"),
        ("add", "99", "--reason", "complained"),  # no such user
        ("remove", "x"),
        ("list", "--reason", "nope"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(settings, sessions, args):
    load_users(sessions, count=3)
    result = run_cli(settings, "suppress", *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error:"), result.stderr
    assert rows(sessions) == {}
