"""Every user of the table is walked, whatever their id: 0 and negative ids are users too.

The walk once began at ``id > 0``: users -5 and 0 never got a report, and nothing said so.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from reports import tokens
from tests.support.databases import load_users
from tests.support.processes import run_cli, wait_for_progress

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"
IDS = [-5, 0, 1]


def test_users_with_ids_minus_5_0_and_1_each_get_one_email(settings, sessions, smtp_server, start_workers):
    settings = replace(settings, smtp_url=smtp_server.url, plan_page_size=1)
    load_users(sessions, count=0, ids=IDS)
    start_workers(settings, processes=1, threads=2)

    assert run_cli(settings, "trigger", PERIOD).returncode == 0
    progress = wait_for_progress(settings, PERIOD)

    assert (progress["total"], progress["delivered"], progress["dead"]) == (3, 3, 0), progress
    by_user = smtp_server.by_user()
    assert {user: len(messages) for user, messages in by_user.items()} == dict.fromkeys(IDS, 1)
    signer = tokens.links(settings).signer
    for user_id, [message] in by_user.items():
        assert message["To"].addresses[0].addr_spec == f"user{user_id}@example.test"
        assert message["Message-ID"] == f"<report.{PERIOD}.{user_id}@reports.test>"
        # Each one's unsubscribe link names them and checks out.
        link = message["List-Unsubscribe"].strip("<>")
        assert signer.user_id(link.rsplit("/", 1)[1]) == user_id
