"""A database error names the statement, never the values bound to it (personal data)."""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from sqlalchemy import text

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
