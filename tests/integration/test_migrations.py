"""The migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from datetime import datetime

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from reports.database import alembic_config, create_db_engine, upgrade
from reports.models import Base

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
            connection.execute(insert, {"period": "2026-10", "body": body})
        with engine.begin() as connection:
            config = alembic_config(settings.database_url)
            config.attributes["connection"] = connection
            command.downgrade(config, "0013")
        with engine.begin() as connection:
            connection.execute(insert, {"period": "2026-11", "body": body})
        upgrade(settings)
        with engine.connect() as connection:
            methods = [connection.execute(compression, {"period": p}).scalar_one() for p in ("2026-10", "2026-11")]
            bodies = connection.execute(text("SELECT DISTINCT body_html FROM reports")).scalars().all()
    finally:
        engine.dispose()
    assert methods == ["lz4", "pglz"]
    assert bodies == [body]
