"""Each report due in its user's morning: the item's due time, the run's send time and default zone

Revision ID: 0013
Revises: 0012

``report_items.due_at`` holds when a waiting item is to be handed out; it is cleared as the item is.
Both new indexes are partial, on waiting items only (pending, with a due time). A trigger on ``users`` makes a waiting item
due at once (the epoch) when its user's time zone changes, so the release reads the new zone and
computes the new due time: in SQL only the fact of the change is needed, not the time zone rules.
``period_runs`` keeps the send time and default zone a run was triggered with.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: reports.models.WAITING: pending items with a due time.
WAITING = "state = 'pending' AND due_at IS NOT NULL"

#: reports.models.LOOK_AGAIN as each dialect writes it.
LOOK_AGAIN = {"postgresql": "'1970-01-01 00:00:00'", "sqlite": "'1970-01-01 00:00:00.000000'"}

POSTGRESQL = [
    f"""
    CREATE FUNCTION report_items_follow_time_zone() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE report_items SET due_at = {LOOK_AGAIN["postgresql"]} WHERE user_id = NEW.id AND {WAITING};
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER report_items_follow_time_zone AFTER UPDATE OF time_zone ON users
    FOR EACH ROW WHEN (OLD.time_zone IS DISTINCT FROM NEW.time_zone)
    EXECUTE FUNCTION report_items_follow_time_zone()
    """,
]

SQLITE = [
    f"""
    CREATE TRIGGER report_items_follow_time_zone AFTER UPDATE OF time_zone ON users
    WHEN OLD.time_zone IS NOT NEW.time_zone BEGIN
        UPDATE report_items SET due_at = {LOOK_AGAIN["sqlite"]} WHERE user_id = NEW.id AND {WAITING};
    END
    """,
]


def upgrade() -> None:
    # Nullable with no default: PostgreSQL adds them without rewriting the tables.
    with op.batch_alter_table("report_items") as batch:
        batch.add_column(sa.Column("due_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("period_runs") as batch:
        batch.add_column(sa.Column("send_at", sa.String(length=5), nullable=True))
        batch.add_column(sa.Column("default_time_zone", sa.Text(), nullable=True))
    waiting = sa.text(WAITING)
    op.create_index(
        "ix_report_items_period_due_at",
        "report_items",
        ["period", "due_at"],
        postgresql_where=waiting,
        sqlite_where=waiting,
    )
    op.create_index(
        "ix_report_items_waiting_user_id", "report_items", ["user_id"], postgresql_where=waiting, sqlite_where=waiting
    )
    dialect = op.get_bind().dialect.name
    for statement in {"postgresql": POSTGRESQL, "sqlite": SQLITE}[dialect]:
        op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER report_items_follow_time_zone ON users")
        op.execute("DROP FUNCTION report_items_follow_time_zone")
    else:
        op.execute("DROP TRIGGER report_items_follow_time_zone")
    op.drop_index("ix_report_items_waiting_user_id", table_name="report_items")
    op.drop_index("ix_report_items_period_due_at", table_name="report_items")
    with op.batch_alter_table("period_runs") as batch:
        batch.drop_column("default_time_zone")
        batch.drop_column("send_at")
    with op.batch_alter_table("report_items") as batch:
        batch.drop_column("due_at")
