"""Each report due in its user's morning: the item's due time, the run's send time and default zone,
the waiting items counted by due time

Revision ID: 0013
Revises: 0012

``report_items.due_at`` holds when a waiting item is to be handed out; it is cleared as the item is.
Both new indexes are partial, on waiting items only (pending, with a due time). A trigger on
``users`` makes a waiting item due at once (the epoch) when its user's time zone changes, so the
release reads the new zone and computes the new due time: in SQL only the fact of the change is
needed, not the time zone rules.
``period_runs`` keeps the send time and default zone a run was triggered with. ``due_counts`` is
kept by triggers as ``item_counts`` is: on PostgreSQL a page recorded (or pruned) adds to it once per
statement, from the transition table; a change of one item runs per row, and only for an item that
was or becomes waiting, so that the deliveries of released items, whose due time is gone, never
run it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def waiting(row: str = "") -> str:
    """reports.models.WAITING (pending, with a due time) of the trigger's ``row`` (``OLD.``, ``NEW.``)
    or of the table's own rows."""
    return f"{row}state = 'pending' AND {row}due_at IS NOT NULL"


WAITING = waiting()

#: reports.models.LOOK_AGAIN as each dialect writes it.
LOOK_AGAIN = {"postgresql": "'1970-01-01 00:00:00'", "sqlite": "'1970-01-01 00:00:00.000000'"}

# Waiting rows of `rows`, counted by due time.
TALLY = f"SELECT period, due_at, count(*) AS n FROM {{rows}} WHERE {WAITING} GROUP BY period, due_at"

POSTGRESQL = [
    f"""
    CREATE FUNCTION due_counts_add_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO due_counts (period, due_at, n)
        SELECT * FROM ({TALLY.format(rows="inserted")}) tally ORDER BY period, due_at
        ON CONFLICT (period, due_at) DO UPDATE SET n = due_counts.n + excluded.n;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER due_counts_on_insert AFTER INSERT ON report_items
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION due_counts_add_inserted()
    """,
    f"""
    CREATE FUNCTION due_counts_remove_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE due_counts SET n = due_counts.n - tally.n FROM ({TALLY.format(rows="deleted")}) tally
        WHERE (due_counts.period, due_counts.due_at) = (tally.period, tally.due_at);
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER due_counts_on_delete AFTER DELETE ON report_items
    REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION due_counts_remove_deleted()
    """,
    f"""
    CREATE FUNCTION due_counts_move() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF {waiting("OLD.")} THEN
            UPDATE due_counts SET n = n - 1 WHERE period = OLD.period AND due_at = OLD.due_at;
        END IF;
        IF {waiting("NEW.")} THEN
            INSERT INTO due_counts (period, due_at, n) VALUES (NEW.period, NEW.due_at, 1)
            ON CONFLICT (period, due_at) DO UPDATE SET n = due_counts.n + 1;
        END IF;
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE TRIGGER due_counts_on_update AFTER UPDATE OF state, due_at ON report_items FOR EACH ROW
    WHEN (({waiting("OLD.")}) OR ({waiting("NEW.")}))
    EXECUTE FUNCTION due_counts_move()
    """,
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
    CREATE TRIGGER due_counts_on_insert AFTER INSERT ON report_items
    WHEN {waiting("NEW.")} BEGIN
        INSERT INTO due_counts (period, due_at, n) VALUES (NEW.period, NEW.due_at, 1)
        ON CONFLICT (period, due_at) DO UPDATE SET n = n + 1;
    END
    """,
    f"""
    CREATE TRIGGER due_counts_on_delete AFTER DELETE ON report_items
    WHEN {waiting("OLD.")} BEGIN
        UPDATE due_counts SET n = n - 1 WHERE period = OLD.period AND due_at = OLD.due_at;
    END
    """,
    f"""
    CREATE TRIGGER due_counts_on_update_old AFTER UPDATE OF state, due_at ON report_items
    WHEN {waiting("OLD.")} BEGIN
        UPDATE due_counts SET n = n - 1 WHERE period = OLD.period AND due_at = OLD.due_at;
    END
    """,
    f"""
    CREATE TRIGGER due_counts_on_update_new AFTER UPDATE OF state, due_at ON report_items
    WHEN {waiting("NEW.")} BEGIN
        INSERT INTO due_counts (period, due_at, n) VALUES (NEW.period, NEW.due_at, 1)
        ON CONFLICT (period, due_at) DO UPDATE SET n = n + 1;
    END
    """,
    f"""
    CREATE TRIGGER report_items_follow_time_zone AFTER UPDATE OF time_zone ON users
    WHEN OLD.time_zone IS NOT NEW.time_zone BEGIN
        UPDATE report_items SET due_at = {LOOK_AGAIN["sqlite"]} WHERE user_id = NEW.id AND {WAITING};
    END
    """,
]


#: Each dialect's triggers and their tables, for the downgrade.
TRIGGERS = {
    True: [
        ("report_items_follow_time_zone", "users"),
        ("due_counts_on_insert", "report_items"),
        ("due_counts_on_delete", "report_items"),
        ("due_counts_on_update", "report_items"),
    ],
    False: [
        ("report_items_follow_time_zone", "users"),
        ("due_counts_on_insert", "report_items"),
        ("due_counts_on_delete", "report_items"),
        ("due_counts_on_update_old", "report_items"),
        ("due_counts_on_update_new", "report_items"),
    ],
}


def upgrade() -> None:
    # Nullable with no default: PostgreSQL adds them without rewriting the tables.
    with op.batch_alter_table("report_items") as batch:
        batch.add_column(sa.Column("due_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("period_runs") as batch:
        batch.add_column(sa.Column("send_at", sa.String(length=5), nullable=True))
        batch.add_column(sa.Column("default_time_zone", sa.Text(), nullable=True))
    op.create_table(
        "due_counts",
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("due_at", sa.DateTime(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("period", "due_at", name=op.f("pk_due_counts")),
    )
    condition = sa.text(WAITING)
    for index, columns in (
        ("ix_report_items_period_due_at", ["period", "due_at"]),
        ("ix_report_items_waiting_user_id", ["user_id"]),
    ):
        op.create_index(index, "report_items", columns, postgresql_where=condition, sqlite_where=condition)
    dialect = op.get_bind().dialect.name
    for statement in {"postgresql": POSTGRESQL, "sqlite": SQLITE}[dialect]:
        op.execute(statement)


def downgrade() -> None:
    on_postgresql = op.get_bind().dialect.name == "postgresql"
    for trigger, table in TRIGGERS[on_postgresql]:
        op.execute(f"DROP TRIGGER {trigger} ON {table}" if on_postgresql else f"DROP TRIGGER {trigger}")
    if on_postgresql:
        for function in (
            "report_items_follow_time_zone",
            "due_counts_add_inserted",
            "due_counts_remove_deleted",
            "due_counts_move",
        ):
            op.execute(f"DROP FUNCTION {function}")
    op.drop_table("due_counts")
    op.drop_index("ix_report_items_waiting_user_id", table_name="report_items")
    op.drop_index("ix_report_items_period_due_at", table_name="report_items")
    with op.batch_alter_table("period_runs") as batch:
        batch.drop_column("default_time_zone")
        batch.drop_column("send_at")
    with op.batch_alter_table("report_items") as batch:
        batch.drop_column("due_at")
