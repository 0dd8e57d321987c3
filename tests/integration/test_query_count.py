"""One user's report costs the same few SQL statements however much activity the user has.

At millions of users a statement per activity or per category (an N+1) would turn a month's run
from minutes into hours, and no functional test would notice: the email is right either way. So
these tests count what the database receives during ``pipeline.run`` for users with 1 and with
200 activities, in one category and in many, and hold the count to today's figure.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert
from sqlalchemy.orm import Session, sessionmaker

from reports.delivery import pipeline
from reports.delivery.mail.backend import build_mailer
from reports.jobs import ReportJob
from reports.models import Activity, User
from reports.settings import Settings
from tests.integration.conftest import PERIOD, walk_everything
from tests.support.databases import in_autocommit
from tests.support.smtp import SmtpServer

#: Statements one monthly report sends to the database today. On PostgreSQL: lock the item, read the
#: run, the user and the activity, count the attempt and take the claim; mark the item delivered and
#: the claim sent and store the report (reports/delivery/store/postgresql.py). On SQLite, which has neither
#: row locks nor data-modifying CTEs, each of those parts is a statement of its own. A change that
#: adds one should be a deliberate one: raise this knowingly, never because it grew with the data.
STATEMENTS_PER_REPORT = {"postgresql": 2, "sqlite": 9}
#: Before the send and after it: no transaction stays open while the provider is talked to.
TRANSACTIONS_PER_REPORT = 2
#: Of those, the ones opened with a BEGIN (and so closed with a COMMIT), two round trips each. On
#: PostgreSQL each of the two statements runs in autocommit, a transaction by itself.
BEGUN_PER_REPORT = {"postgresql": 0, "sqlite": 2}


@dataclass(frozen=True)
class Shape:
    """How much activity one user has."""

    in_period: int
    categories: int
    #: Activities in the month before, read by the same query for the "previous month" figure.
    month_before: int = 0


#: user id → their activity. The last has one category per activity: a loop over categories
#: that queried would show there first.
SHAPES = {
    1: Shape(in_period=1, categories=1),
    2: Shape(in_period=200, categories=1),
    3: Shape(in_period=200, categories=10, month_before=200),
    4: Shape(in_period=200, categories=200, month_before=200),
}


@pytest.fixture
def context(settings: Settings, sessions: sessionmaker[Session], smtp_server: SmtpServer) -> pipeline.Context:
    mail_settings = replace(settings, smtp_url=smtp_server.url)
    return pipeline.Context(settings=mail_settings, sessions=sessions, mailer=build_mailer(mail_settings))


@pytest.fixture
def population(settings: Settings, sessions: sessionmaker[Session]) -> dict[int, Shape]:
    """The users of :data:`SHAPES`, planned for the period, each with one activity after it too."""
    users, activities = [], []
    for user_id, shape in SHAPES.items():
        users.append({"id": user_id, "email": f"user{user_id}@example.test", "name": f"User {user_id}", "active": True})
        activities += [
            {
                "user_id": user_id,
                "occurred_at": datetime(2026, 10, 1 + k % 31, 12),
                "category": f"category {k % shape.categories}",
                "amount_cents": 100,
            }
            for k in range(shape.in_period)
        ]
        activities += [
            {
                "user_id": user_id,
                "occurred_at": datetime(2026, 9, 1 + k % 30, 8),
                "category": f"category {k % shape.categories}",
                "amount_cents": 50,
            }
            for k in range(shape.month_before)
        ]
        activities.append(
            {"user_id": user_id, "occurred_at": datetime(2026, 11, 1), "category": "later", "amount_cents": 777}
        )
    with sessions.begin() as session:
        session.execute(insert(User), users)
        session.execute(insert(Activity), activities)
    walk_everything(sessions, settings)
    return SHAPES


@dataclass
class Counted:
    #: The first line of every statement, in order (SQLite's ``BEGIN IMMEDIATE`` counted as a transaction).
    statements: list[str] = field(default_factory=list)
    #: Transactions opened with a BEGIN.
    begun: int = 0
    #: Statements run in autocommit, each a transaction by itself.
    autocommitted: int = 0

    @property
    def transactions(self) -> int:
        return self.begun + self.autocommitted


@contextmanager
def counting(engine: Engine) -> Iterator[Counted]:
    """Record every statement and transaction ``engine`` runs inside the block."""
    counted = Counted()

    def on_statement(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        # On SQLite the engine opens each transaction with this statement itself (reports.database).
        if statement.strip().upper() != "BEGIN IMMEDIATE":
            counted.statements.append(statement.strip().splitlines()[0])
        if in_autocommit(conn):
            counted.autocommitted += 1

    def on_begin(conn: Any) -> None:
        # SQLAlchemy begins one on a connection in autocommit too, which sends the server nothing.
        if not in_autocommit(conn):
            counted.begun += 1

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "begin", on_begin)
    try:
        yield counted
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "begin", on_begin)


def run_counted(
    settings: Settings, sessions: sessionmaker[Session], context: pipeline.Context, user_id: int
) -> Counted:
    engine = sessions.kw["bind"]
    with counting(engine) as counted:
        outcome = pipeline.run(context, ReportJob(PERIOD, user_id, settings.template_version))
    assert outcome == pipeline.Outcome.DELIVERED
    return counted


def test_a_report_costs_as_many_statements_for_200_activities_as_for_one(
    settings, sessions, context, smtp_server, population
):
    """A statement per activity or per category would show as a longer list for users 2 to 4."""
    counted = {user_id: run_counted(settings, sessions, context, user_id) for user_id in population}

    # The emails say every activity was read: the count held because the work was done in SQL.
    for user_id, shape in population.items():
        [message] = smtp_server.by_user()[user_id]
        plain = message.get_body(("plain",)).get_content().replace("\r\n", "\n")
        assert f"Activities: {shape.in_period}\n" in plain
        assert plain.count("\n  - category ") == shape.categories
    one_activity = counted[1].statements
    for user_id in population:
        assert counted[user_id].statements == one_activity, (
            f"user {user_id} ({population[user_id]}) took {len(counted[user_id].statements)} statements, "
            f"a user with one activity {len(one_activity)}:\n" + "\n".join(counted[user_id].statements)
        )
        assert counted[user_id].transactions == counted[1].transactions


def test_a_report_costs_a_small_fixed_number_of_statements(settings, sessions, context, smtp_server, population):
    """Today's figure, so one statement more per report (a million more per run) is a decision."""
    busiest = max(population, key=lambda user_id: population[user_id].categories)

    counted = run_counted(settings, sessions, context, busiest)

    dialect = sessions.kw["bind"].dialect.name
    assert len(counted.statements) == STATEMENTS_PER_REPORT[dialect], "\n".join(counted.statements)
    assert counted.transactions == TRANSACTIONS_PER_REPORT
    assert counted.begun == BEGUN_PER_REPORT[dialect]
    assert len(smtp_server.by_user()[busiest]) == 1
