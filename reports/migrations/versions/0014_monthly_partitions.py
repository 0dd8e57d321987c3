"""The per-user tables partitioned by month on PostgreSQL

Revision ID: 0014
Revises: 0013

``report_items``, ``deliveries`` and ``reports`` become tables partitioned by LIST of ``period``,
one partition a month (``report_items_2026_11``), so that a pruned month goes by dropping its
partitions (reports/partitions.py). Each table is rebuilt under its own name: its indexes and
triggers are read from the catalog first and made again on the new table as they were (the item and
due counts of 0004 and 0013, the partial indexes of waiting items), its rows moved across without
firing the count triggers (the rows move, the counts stay right), and a partition is made for every
month any of the tables, a run or a send-now request names. The tables are locked for the whole
migration: docs/howto/upgrade.md says how long it takes. Nothing refers to these tables by a foreign
key. On SQLite nothing changes.
"""

import re
from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("report_items", "deliveries", "reports")

#: Tables whose periods get a partition: those whose rows are moved, and those whose rows are
#: about to be written (a run's walk, a send-now request's claim).
PERIODS_FROM = (*TABLES, "period_runs", "resends")


def _rebuild(table: str, periods: list[str] | None) -> None:
    """Make ``table`` again with its rows, indexes and triggers: partitioned by month with a
    partition for each of ``periods``, or, with ``None``, as one plain table."""
    connection = op.get_bind()
    # Read before the rename, so that each definition names the table by its name.
    indexes = connection.scalars(
        text(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = CAST(:t AS regclass) "
            "AND NOT i.indisprimary ORDER BY i.indexrelid"
        ),
        {"t": table},
    ).all()
    triggers = connection.scalars(
        text(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = CAST(:t AS regclass) AND NOT tgisinternal "
            "ORDER BY tgname"
        ),
        {"t": table},
    ).all()
    moving = f"{table}_moving"
    op.execute(f"ALTER TABLE {table} RENAME TO {moving}")
    op.execute(f"ALTER TABLE {moving} RENAME CONSTRAINT pk_{table} TO pk_{moving}")
    # Index names are the schema's: free them for the new table's.
    for index in connection.scalars(
        text(
            "SELECT CAST(indexrelid AS regclass) FROM pg_index WHERE indrelid = CAST(:t AS regclass) AND NOT indisprimary"
        ),
        {"t": moving},
    ).all():
        op.execute(f"DROP INDEX {index}")
    partitioned = "" if periods is None else " PARTITION BY LIST (period)"
    op.execute(f"CREATE TABLE {table} (LIKE {moving} INCLUDING DEFAULTS INCLUDING CONSTRAINTS){partitioned}")
    for period in periods or []:
        op.execute(f"CREATE TABLE {table}_{period.replace('-', '_')} PARTITION OF {table} FOR VALUES IN ('{period}')")
    # Before the new table's triggers exist: moved rows are counted already.
    op.execute(f"INSERT INTO {table} SELECT * FROM {moving}")
    op.execute(f"DROP TABLE {moving}")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY (period, user_id)")
    for statement in (*indexes, *triggers):
        # A partitioned table's index is defined ON ONLY it; the plain table's has no partitions.
        op.execute(statement.replace(" ON ONLY ", " ON ") if periods is None else statement)
    op.execute(f"ANALYZE {table}")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    union = " UNION ".join(f"SELECT period FROM {table}" for table in PERIODS_FROM)
    periods = list(op.get_bind().scalars(text(f"SELECT period FROM ({union}) p WHERE period IS NOT NULL ORDER BY 1")))
    malformed = [period for period in periods if not re.fullmatch("[0-9]{4}-[0-9]{2}", period)]
    if malformed:
        raise ValueError(f"Rows of periods that are no month, not migrated: {malformed[:10]}; delete or correct them.")
    for table in TABLES:
        _rebuild(table, periods)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        _rebuild(table, None)
