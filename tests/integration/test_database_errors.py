"""A database error names the statement, never the values bound to it (personal data); a pooled
connection that died while idle is replaced before it is used."""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from sqlalchemy import text

from reports import database
from reports.database import create_db_engine


def test_a_failed_statement_keeps_its_bound_values_out_of_the_error(sessions, settings):
    engine = create_db_engine(settings.database_url)
    row = {"id": 1, "email": "eve.private@example.test", "name": "Eve Private", "active": True}
    insert = text("INSERT INTO users (id, email, name, active) VALUES (:id, :email, :name, :active)")
    try:
        with engine.begin() as connection:
            connection.execute(insert, row)
        with pytest.raises(sqlalchemy.exc.IntegrityError) as caught, engine.begin() as connection:
            connection.execute(insert, row)
    finally:
        engine.dispose()
    shown = str(caught.value)
    assert "INSERT INTO users" in shown
    assert "eve.private@example.test" not in shown and "Eve Private" not in shown


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_connection_that_died_while_idle_is_replaced_before_it_is_handed_out(sessions, settings, monkeypatch):
    monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 0.0)
    engine = create_db_engine(settings.database_url)
    try:
        with engine.connect() as connection:
            first = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with sessions() as admin:  # a server restart or a proxy's idle timeout, as the pool sees it
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        with engine.connect() as connection:
            second = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
    finally:
        engine.dispose()
    assert second != first


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_connection_given_back_a_moment_ago_is_handed_out_without_a_ping(sessions, settings, monkeypatch):
    engine = create_db_engine(settings.database_url)
    pings: list[object] = []
    monkeypatch.setattr(engine.dialect, "do_ping", pings.append)
    try:
        for _ in range(3):
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        monkeypatch.setattr(database, "PING_AFTER_IDLE_SECONDS", 0.0)
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        engine.dispose()
    assert len(pings) == 1  # only once it had been idle longer than PING_AFTER_IDLE_SECONDS
