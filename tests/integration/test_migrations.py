"""The migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from datetime import datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session

from reports import partitions
from reports.database import alembic_config, create_db_engine, downgrade, upgrade
from reports.models import Base, DeadLetter
from tests.support.databases import pg_connect
from tests.support.processes import run_cli

CONTRACT_COLUMNS = {
    "users": {"id", "email", "name", "active"},
    "activities": {"id", "user_id", "occurred_at", "category", "amount_cents"},
}


# SQLite's reflection skips expression indexes (users' lower(email)), and Alembic then skips
# comparing them, each with a warning; PostgreSQL compares them.
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index:sqlalchemy.exc.SAWarning")
@pytest.mark.filterwarnings("ignore:autogenerate skipping metadata-specified expression-based index:UserWarning")
def test_the_migrated_schema_matches_the_models(settings, sessions):
    engine = create_db_engine(settings.database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
            )
            differences = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()

    assert differences == []


def test_the_contract_columns_exist_with_their_meaning(settings, sessions):
    engine = create_db_engine(settings.database_url)
    try:
        inspector = inspect(engine)
        columns = {table: {c["name"]: c for c in inspector.get_columns(table)} for table in CONTRACT_COLUMNS}
        users_pk = inspector.get_pk_constraint("users")["constrained_columns"]
        activities_pk = inspector.get_pk_constraint("activities")["constrained_columns"]
        foreign_keys = inspector.get_foreign_keys("activities")
    finally:
        engine.dispose()

    for table, expected in CONTRACT_COLUMNS.items():
        assert expected <= set(columns[table]), f"{table} lacks {expected - set(columns[table])}"
    assert users_pk == ["id"]
    assert activities_pk == ["id"]
    assert columns["users"]["email"]["nullable"] is False
    assert columns["users"]["active"]["nullable"] is False
    assert columns["activities"]["occurred_at"]["nullable"] is False
    assert columns["activities"]["category"]["nullable"] is False
    assert columns["activities"]["amount_cents"]["nullable"] is False
    assert [(fk["constrained_columns"], fk["referred_table"], fk["referred_columns"]) for fk in foreign_keys] == [
        (["user_id"], "users", ["id"])
    ]


def test_a_run_that_had_walked_nobody_starts_before_any_user_after_the_upgrade(settings):
    """A walk began above id 0 before: a cursor of 0 meant nobody walked yet, and now means NULL."""
    upgrade(settings, "0010")
    engine = create_db_engine(settings.database_url)
    try:
        with engine.begin() as connection:
            for period, cursor in (("2026-09", 0), ("2026-10", 42)):
                connection.execute(
                    text(
                        "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at,"
                        " updated_at) VALUES (:period, 'active', 'v2', :cursor, false, :at, :at)"
                    ),
                    {"period": period, "cursor": cursor, "at": datetime(2026, 11, 1)},
                )
        upgrade(settings)
        with engine.connect() as connection:
            cursors = dict(connection.execute(text("SELECT period, cursor FROM period_runs ORDER BY period")).all())
    finally:
        engine.dispose()
    assert cursors == {"2026-09": None, "2026-10": 42}


#: Rows a database at 0013 holds: two months, one waiting for its due time, and what the counts say.
BEFORE_0014 = [
    "INSERT INTO users (id, email, name, active, time_zone) VALUES (1, 'a@x.test', 'A', true, 'UTC'),"
    " (2, 'b@x.test', 'B', true, 'UTC'), (3, 'c@x.test', 'C', true, 'UTC')",
    "INSERT INTO period_runs (period, state, template_version, cursor, planned, triggered_at, updated_at, send_at,"
    " default_time_zone) VALUES ('2026-09', 'active', 'v2', 3, true, :at, :at, NULL, NULL),"
    " ('2026-10', 'active', 'v2', 3, true, :at, :at, '08:00', 'UTC')",
    "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at, due_at) VALUES"
    " ('2026-09', 1, 'delivered', 1, :at, :at, NULL), ('2026-09', 2, 'dead', 3, :at, :at, NULL),"
    " ('2026-10', 1, 'delivered', 1, :at, :at, NULL), ('2026-10', 2, 'pending', 0, :at, :at, :due),"
    " ('2026-10', 3, 'pending', 0, :at, :at, :due)",
    "INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at, times_taken,"
    " claimed_at, sent_at) VALUES ('2026-09', 1, 'sent', '<a>', 't', :at, 1, :at, :at),"
    " ('2026-10', 1, 'sent', '<b>', 't', :at, 1, :at, :at)",
    "INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at) VALUES"
    " ('2026-09', 1, 'v2', 's', 't', 'h', :at), ('2026-10', 1, 'v2', 's', 't', 'h', :at)",
    # A send-now request of a month with no rows yet: its message writes that month's delivery.
    "INSERT INTO resends (request_id, period, user_id, requested_at, state, message_id, claim_token,"
    " lease_expires_at, times_taken, claimed_at) VALUES ('r1', '2026-08', 3, :at, 'requested', '<r>', '', :at, 0, :at)",
]

SNAPSHOT = {
    "items": "SELECT period, user_id, state, attempts, due_at FROM report_items ORDER BY 1, 2",
    "deliveries": "SELECT period, user_id, state, message_id FROM deliveries ORDER BY 1, 2",
    "reports": "SELECT period, user_id, subject FROM reports ORDER BY 1, 2",
    "item counts": "SELECT period, shard, counter, n FROM item_counts ORDER BY 1, 2, 3",
    "due counts": "SELECT period, due_at, n FROM due_counts ORDER BY 1, 2",
}


def snapshot(connection) -> dict[str, list]:  # type: ignore[no-untyped-def]
    return {name: [tuple(row) for row in connection.execute(text(query))] for name, query in SNAPSHOT.items()}


def layout(connection) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Each per-user table and partition, and its kind: ``p`` partitioned, ``r`` a plain table."""
    if connection.dialect.name != "postgresql":
        return {}
    query = (
        "SELECT relname, relkind FROM pg_class WHERE relkind IN ('r', 'p') AND relnamespace = 'public'::regnamespace"
        " AND (relname IN ('report_items', 'deliveries', 'reports') OR relname ~ '_[0-9]{4}_[0-9]{2}$')"
    )
    return dict(connection.execute(text(query)).all())


def test_the_monthly_partitions_take_in_a_database_with_rows_and_every_count_carries_on(settings):
    upgrade(settings, "0013")
    engine = create_db_engine(settings.database_url)
    at, due = datetime(2026, 11, 1), datetime(2026, 11, 1, 8)
    try:
        with engine.begin() as connection:
            for statement in BEFORE_0014:
                connection.execute(text(statement), {"at": at, "due": due})
            before = snapshot(connection)

        upgrade(settings)

        with engine.begin() as connection:
            assert snapshot(connection) == before
            on_postgresql = connection.dialect.name == "postgresql"
            months = ("2026_08", "2026_09", "2026_10")
            assert layout(connection) == (
                {
                    **{table: "p" for table in ("report_items", "deliveries", "reports")},
                    **{
                        f"{table}_{month}": "r"
                        for table in ("report_items", "deliveries", "reports")
                        for month in months
                    },
                }
                if on_postgresql
                else {}
            )
            # The triggers of 0004 and 0013 work on the new tables: a state changed, a time zone changed.
            connection.execute(
                text("UPDATE report_items SET state = 'delivered' WHERE period = '2026-10' AND user_id = 2")
            )
            connection.execute(text("UPDATE users SET time_zone = 'Asia/Tashkent' WHERE id = 3"))
            counts = dict(
                connection.execute(
                    text("SELECT counter, sum(n) FROM item_counts WHERE period = '2026-10' GROUP BY counter")
                ).all()
            )
            assert counts == {"recorded": 3, "delivered": 2}
            # User 3's waiting item is due at once (the epoch), for the release to look at its new zone.
            waiting = "SELECT n FROM due_counts WHERE period = '2026-10' AND n > 0 AND due_at < '2000-01-01'"
            assert connection.scalars(text(waiting)).all() == [1]
            # The send-now request's month has its partitions: its message can write its delivery.
            connection.execute(
                text(
                    "INSERT INTO deliveries (period, user_id, state, message_id, claim_token, lease_expires_at,"
                    " times_taken, claimed_at) VALUES ('2026-08', 3, 'claimed', '<r>', 't', :at, 1, :at)"
                ),
                {"at": at},
            )
            if on_postgresql:
                # The partial indexes of waiting items are on every month's partition.
                assert (
                    connection.scalar(
                        text(
                            "SELECT count(*) FROM pg_indexes WHERE tablename = 'report_items_2026_10'"
                            " AND indexdef LIKE '%WHERE%pending%due_at IS NOT NULL%'"
                        )
                    )
                    == 2
                )
            after = snapshot(connection)

        downgrade(settings, "0013")
        with engine.connect() as connection:
            assert snapshot(connection) == after
            assert layout(connection) == (
                {table: "r" for table in ("report_items", "deliveries", "reports")} if on_postgresql else {}
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_rows_of_a_period_that_is_no_month_stop_the_partitioning_and_change_nothing(settings):
    upgrade(settings, "0013")
    engine = create_db_engine(settings.database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO report_items (period, user_id, state, attempts, created_at, updated_at)"
                    " VALUES ('2026-1', 1, 'pending', 0, :at, :at)"
                ),
                {"at": datetime(2026, 11, 1)},
            )
        with pytest.raises(ValueError, match="'2026-1'"):
            upgrade(settings)
        with engine.connect() as connection:
            assert connection.scalar(text("SELECT version_num FROM alembic_version")) == "0013"
            assert layout(connection) == {table: "r" for table in ("report_items", "deliveries", "reports")}
    finally:
        engine.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_report_bodies_are_stored_compressed_with_lz4_and_the_migration_goes_down_and_up(settings, sessions):
    body = "<p>Spent 12.34 on groceries.</p>" * 500  # compressible, past the size PostgreSQL compresses at
    engine = create_db_engine(settings.database_url)
    insert = text(
        "INSERT INTO reports (period, user_id, template_version, subject, body_text, body_html, rendered_at)"
        " VALUES (:period, 1, 'v1', 's', 't', :body, now())"
    )
    compression = text("SELECT pg_column_compression(body_html) FROM reports WHERE period = :period")
    try:
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO users (id, email, name, active) VALUES (1, 'a@example.test', 'A', true)")
            )
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-10")
        with engine.begin() as connection:
            connection.execute(insert, {"period": "2026-10", "body": body})
        downgrade(settings, "0013")
        with engine.begin() as connection:
            connection.execute(insert, {"period": "2026-11", "body": body})
        upgrade(settings)
        # A month whose partitions are made after the migration compresses with LZ4 too.
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-12")
        with engine.begin() as connection:
            connection.execute(insert, {"period": "2026-12", "body": body})
        with engine.connect() as connection:
            methods = [
                connection.execute(compression, {"period": p}).scalar_one() for p in ("2026-10", "2026-11", "2026-12")
            ]
            bodies = connection.execute(text("SELECT DISTINCT body_html FROM reports")).scalars().all()
    finally:
        engine.dispose()
    assert methods == ["lz4", "pglz", "lz4"]
    assert bodies == [body]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_items_partitions_that_exist_get_room_for_updates_and_lose_it_going_down(settings, sessions):
    options = text(
        "SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'report_items_2026_%' AND relkind = 'r' ORDER BY 1"
    )
    engine = create_db_engine(settings.database_url)
    try:
        downgrade(settings, "0015")
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-10")  # made as the code before made it
            session.execute(text("ALTER TABLE report_items_2026_10 RESET (fillfactor)"))
        upgrade(settings)
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-11")  # made after the upgrade
        with engine.connect() as connection:
            upgraded = connection.execute(options).all()
        downgrade(settings, "0015")
        with engine.connect() as connection:
            downgraded = connection.execute(options).all()
    finally:
        engine.dispose()
    assert [(name, "fillfactor=50" in options) for name, options in upgraded] == [
        ("report_items_2026_10", True),
        ("report_items_2026_11", True),
    ]
    assert downgraded == [("report_items_2026_10", None), ("report_items_2026_11", None)]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_months_partitions_wait_for_a_thousand_changes_before_autovacuum_and_the_migration_goes_down_and_up(
    settings, sessions
):
    """Autovacuum's first look at a month's partitions sets the plans the workers keep; at a few
    dozen rows those plans would scan the whole partition for each message."""
    options = text(
        "SELECT relname, reloptions FROM pg_class WHERE relname ~ '_2026_1[01]$' AND relkind = 'r' ORDER BY 1"
    )
    first_look = {"autovacuum_vacuum_threshold=1000", "autovacuum_analyze_threshold=1000"}

    def thresholds(rows: list[tuple[str, list[str] | None]]) -> dict[str, set[str]]:
        return {name: {option for option in options or [] if "threshold" in option} for name, options in rows}

    engine = create_db_engine(settings.database_url)
    try:
        downgrade(settings, "0017")
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-10")  # made as the code before made it
            for table in partitions.PARTITIONED:
                session.execute(
                    text(
                        f"ALTER TABLE {partitions.name(table, '2026-10')} "
                        "RESET (autovacuum_vacuum_threshold, autovacuum_analyze_threshold)"
                    )
                )
        with engine.connect() as connection:
            before = thresholds(connection.execute(options).all())
        upgrade(settings)
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-11")  # made after the upgrade
        with engine.connect() as connection:
            upgraded = thresholds(connection.execute(options).all())
        downgrade(settings, "0017")
        with engine.connect() as connection:
            downgraded = thresholds(connection.execute(options).all())
    finally:
        engine.dispose()
    october = ["deliveries_2026_10", "report_items_2026_10", "reports_2026_10"]
    november = ["deliveries_2026_11", "report_items_2026_11", "reports_2026_11"]
    assert before == dict.fromkeys(october, set())
    assert upgraded == dict.fromkeys(october + november, first_look)
    assert downgraded == dict.fromkeys(october + november, set())


def test_only_pending_items_are_in_the_index_by_state_and_the_migration_goes_down_and_up(settings, sessions):
    """A period's pending items are found through an index that holds them alone, in a month that
    existed before the upgrade as in one made after it; going down brings the index of every state back."""
    engine = create_db_engine(settings.database_url)
    on_postgresql = engine.dialect.name == "postgresql"
    indexes = text(
        "SELECT tablename, indexdef FROM pg_indexes WHERE tablename LIKE 'report_items%' AND indexdef LIKE '%(period, %'"
        " AND indexdef LIKE '%state%' AND indexdef NOT LIKE '%due_at%' ORDER BY 1"
        if on_postgresql
        else "SELECT tbl_name, sql FROM sqlite_master WHERE type = 'index' AND (name LIKE '%state%'"
        " OR name LIKE '%pending%') ORDER BY 1"
    )
    try:
        downgrade(settings, "0016")
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-10")  # made before the upgrade
        upgrade(settings)
        with Session(engine) as session, session.begin():
            partitions.ensure(session, "2026-11")  # made after it
        with engine.connect() as connection:
            upgraded = [(table, " ".join(definition.split())) for table, definition in connection.execute(indexes)]
        downgrade(settings, "0016")
        with engine.connect() as connection:
            downgraded = [(table, " ".join(definition.split())) for table, definition in connection.execute(indexes)]
    finally:
        engine.dispose()
    tables = ["report_items", "report_items_2026_10", "report_items_2026_11"] if on_postgresql else ["report_items"]
    assert [table for table, _ in upgraded] == tables
    assert all("(period, user_id) WHERE" in d and "'pending'" in d and "state," not in d for _, d in upgraded)
    assert [table for table, _ in downgraded] == tables
    assert all("(period, state, user_id)" in d and "WHERE" not in d for _, d in downgraded)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_migration_that_a_long_transaction_holds_up_gives_up_and_changes_nothing(settings, sessions):
    """Queued behind a long transaction for its lock, a migration would queue every worker behind
    it: it gives up instead, in one line, and runs once the transaction is over."""
    revision = text("SELECT version_num FROM alembic_version")
    downgrade(settings, "0016")  # 0017 drops an index of report_items: it needs the table to itself
    with pg_connect(settings.database_url) as reader:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM report_items")  # a long report, say
        refused = run_cli(settings, "db", "upgrade")
        reader.execute("ROLLBACK")
    with sessions() as session:
        held_up_at = session.scalar(revision)
    again = run_cli(settings, "db", "upgrade")
    with sessions() as session:
        assert (held_up_at, session.scalar(revision)) == (
            "0016",
            ScriptDirectory.from_config(alembic_config(settings.database_url)).get_current_head(),
        )
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: A migration waited 10 s for a table that another transaction holds")
    assert len(refused.stderr.splitlines()) == 1
    assert again.returncode == 0, again.stderr


def test_the_dead_letters_not_yet_replayed_have_indexes_of_their_own_that_lists_and_counts_use(settings, sessions):
    """A page of the dead-letters list, newest first, reads only letters not yet replayed: at
    300,000 letters, most of them replayed, a page walked every letter and took over a second."""
    with sessions() as session:
        page = select(DeadLetter.id).where(DeadLetter.replayed_at.is_(None)).order_by(DeadLetter.id.desc()).limit(50)
        by_period = page.where(DeadLetter.period == "2026-10")
        if settings.database_url.startswith("postgresql"):
            session.execute(text("SET LOCAL enable_seqscan = off"))
            plans = [
                "\n".join(session.scalars(text("EXPLAIN " + str(q.compile(compile_kwargs={"literal_binds": True})))))
                for q in (page, by_period)
            ]
        else:
            plans = [
                "\n".join(
                    str(row[-1])
                    for row in session.execute(
                        text("EXPLAIN QUERY PLAN " + str(q.compile(compile_kwargs={"literal_binds": True})))
                    )
                )
                for q in (page, by_period)
            ]
    assert "ix_dead_letters_unreplayed_id" in plans[0], plans[0]
    assert "ix_dead_letters_unreplayed_period_id" in plans[1], plans[1]
