"""A month's partitions first vacuumed and analyzed after a thousand changes

Revision ID: 0018
Revises: 0017

The per-report statements run prepared, on a plan each worker's connection keeps until the
partition's statistics change. Autovacuum first looks at a table after 50 changes; in a month sent
at each user's morning that can be while its partitions hold a few dozen rows, and the plans then
made scan a whole partition for each message (bench/first_look.py: recording a send took 2.00 ms
instead of 0.35 once the partition held 30,000 rows) until autovacuum looks again. A partition never
looked at is planned through its keys, and so is one of a thousand rows or more: partitions made
from now on wait for a thousand changes (reports/partitions.py), and this sets the same on those
that exist. On SQLite nothing changes.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: As reports/partitions.py has it; a migration keeps its own copy, as the code may change after it.
FIRST_LOOK_AFTER = 1000
OPTIONS = ("autovacuum_vacuum_threshold", "autovacuum_analyze_threshold")


def _partitions() -> list[str]:
    return list(
        op.get_bind().scalars(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent IN ('report_items'::regclass, 'deliveries'::regclass, 'reports'::regclass)"
                " ORDER BY 1"
            )
        )
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    settings = ", ".join(f"{option} = {FIRST_LOOK_AFTER}" for option in OPTIONS)
    for partition in _partitions():
        op.execute(f"ALTER TABLE {partition} SET ({settings})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for partition in _partitions():
        op.execute(f"ALTER TABLE {partition} RESET ({', '.join(OPTIONS)})")
