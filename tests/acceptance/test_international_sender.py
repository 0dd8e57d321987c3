"""A sender on an internationalised domain: real workers hand every report to a real SMTP server.

Before, MAIL_FROM=Reports <reports@exämple.com> started cleanly and then every report raised
UnicodeEncodeError, was retried for hours and dead-lettered.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.databases import load_users
from tests.support.processes import run_cli, wait_for_progress

pytestmark = pytest.mark.acceptance

PERIOD = "2026-10"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the path crosses no database
def test_a_sender_on_an_internationalised_domain_gets_every_report_delivered(
    settings, sessions, smtp_server, start_workers
):
    settings = replace(settings, smtp_url=smtp_server.url, mail_from="Rapports Société <rapports@exämple.com>")
    population = load_users(sessions, count=6, inactive_every=100)
    start_workers(settings, processes=1, threads=2)

    assert run_cli(settings, "trigger", PERIOD).returncode == 0
    progress = wait_for_progress(settings, PERIOD)
    assert progress["delivered"] == len(population.active), progress

    by_user = smtp_server.by_user()
    assert sorted(by_user) == population.active and all(len(m) == 1 for m in by_user.values())
    assert set(smtp_server.handler.senders) == {"rapports@xn--exmple-cua.com"}
    for user_id, [message] in by_user.items():
        sender = message["From"].addresses[0]
        assert (sender.display_name, sender.addr_spec) == ("Rapports Société", "rapports@xn--exmple-cua.com")
        assert message["Message-ID"] == f"<report.{PERIOD}.{user_id}@xn--exmple-cua.com>"
