"""Time the console's pages against a period of a million report items on PostgreSQL.

Usage: python bench/console.py [--items 1000000] [--dead-letters 100000] [--repeats 30]

Creates (and drops) a database of its own on TEST_POSTGRES_URL's server and fills one period as a
run leaves it midway (bench/items.py), with 11 more periods triggered beside it and
``--dead-letters`` dead letters, by plain SQL. Then it logs in to the console (in-process, through
the web process's guards, on the test Redis) and times each answer, warmed once, then --repeats
times (median, p95, max): the periods list, the period's page, its live progress, and the
dead-letter list's first page and a page by keyset deep in the list. The target is 100 ms each.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

from items import PERIOD, period_of_items  # bench/items.py, beside this script
from progress import percentile  # bench/progress.py, beside this script
from support import pg_connect, temporary_database  # bench/support.py, beside this script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reports.models import ItemState
from reports.settings import Settings
from tests.support.console import client, console_settings

#: What the issue asks of one answer, in milliseconds.
TARGET_MS = 100
MIX = {ItemState.PENDING: 10, ItemState.SKIPPED: 3, ItemState.DEAD: 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dead-letters", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    with temporary_database() as url, period_of_items(url, items=args.items, percent=MIX, planned=True) as sessions:
        _fill(url, args.dead_letters)
        settings = console_settings(
            replace(Settings(database_url=url), broker_namespace=f"bench-console-{uuid.uuid4().hex[:8]}"),
            unsubscribe_secret="bench-unsubscribe-secret-0123456789",
        )
        console = client(settings, sessions)
        assert console.login() == 200
        deep = int(re.findall(r"/console/dead-letters/(\d+)", console.http.get("/console/dead-letters").text)[-1]) // 2
        pages = {
            "periods list (12 periods)": "/console/periods",
            f"period page, {args.items:,} items": f"/console/periods/{PERIOD}",
            "live progress (JSON)": f"/console/periods/{PERIOD}/progress",
            f"dead letters, first page of {args.dead_letters:,}": "/console/dead-letters",
            "dead letters, a page deep by keyset": f"/console/dead-letters?before={deep}",
            "dead letters of the period, by reason": f"/console/dead-letters?period={PERIOD}&reason=permanent",
        }
        for name, path in pages.items():
            assert console.http.get(path).status_code == 200, path  # warm
            timings = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                answer = console.http.get(path)
                timings.append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 200 and answer.url.path == path.split("?")[0], path
            print(
                f"{name}: median {statistics.median(timings):.1f} ms, p95 {percentile(timings, 95):.1f} ms, "
                f"max {max(timings):.1f} ms over {args.repeats} (target {TARGET_MS} ms)"
            )


def _fill(url: str, dead: int) -> None:
    with pg_connect(url) as connection:
        connection.execute(
            "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at, updated_at) "
            "SELECT to_char(make_date(2025, m, 1), 'YYYY-MM'), 'active', 'v2', 0, true, now(), now() "
            "FROM generate_series(1, 11) m"
        )
        connection.execute(
            "INSERT INTO dead_letters (message_id, actor, queue, payload, period, user_id, attempts, reason, "
            "error_class, error_message, first_failed_at, died_at) "
            "SELECT 'm' || g, 'build_report', 'bulk', '{\"args\": [], \"kwargs\": {}}', %s, g, 1, "
            "CASE WHEN g %% 3 = 0 THEN 'retries_exhausted' ELSE 'permanent' END, 'MailRejected', "
            "'SMTP 550: 5.1.1 No such user', now(), now() FROM generate_series(1, %s) g",
            (str(PERIOD), dead),
        )
        connection.execute("VACUUM ANALYZE dead_letters")


if __name__ == "__main__":
    main()
