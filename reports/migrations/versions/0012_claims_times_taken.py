"""The claims' count named for what it counts: ``claims`` becomes ``times_taken`` in ``deliveries``
and ``resends`` (every take of the claim, re-takes after a release included)

Revision ID: 0012
Revises: 0011

A rename only: no row is rewritten (SQLite copies each table, as its ALTER TABLE requires).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("deliveries", "resends")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.alter_column("claims", new_column_name="times_taken")


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch_op:
            batch_op.alter_column("times_taken", new_column_name="claims")
