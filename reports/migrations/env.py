"""Alembic environment: the URL comes from settings, or a connection handed in by the caller."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from reports.database import create_db_engine
from reports.models import Base
from reports.partitions import is_partition

config = context.config
target_metadata = Base.metadata


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """Leave the months' partitions out of autogenerate: the models describe their parent tables."""
    return not (type_ == "table" and name is not None and is_partition(name))


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_db_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


run_migrations_online()
