"""item counts kept by triggers

Revision ID: 0004
Revises: 0003

Progress read a period by counting its items: at a million items, a scan of a million index
entries on every `reports progress` and every scrape. The triggers below keep the counts as
items are recorded, change state or go. On PostgreSQL, an INSERT or DELETE of many rows (the
coordinator records a thousand at a time) adds to the counts once per statement, from its
transition table; a change of state, one item at a time, runs per row, and only when the state
did change. Pending is never counted: it is recorded minus finished, so recording (the
coordinator) and finishing (the workers) never touch the same row.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHARD = "user_id % 16"

# Rows of `rows` as counts to add: every one to 'recorded', and those in a final state to it.
TALLY = f"""
    SELECT period, {SHARD} AS shard, 'recorded' AS counter, count(*) AS n FROM {{rows}} GROUP BY period, shard
    UNION ALL
    SELECT period, {SHARD}, state, count(*) FROM {{rows}} WHERE state <> 'pending' GROUP BY period, {SHARD}, state
"""

POSTGRESQL = [
    f"""
    CREATE FUNCTION item_counts_add_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- In key order, so that two statements adding to the same counts cannot deadlock.
        INSERT INTO item_counts (period, shard, counter, n)
        SELECT * FROM ({TALLY.format(rows="inserted")}) tally ORDER BY period, shard, counter
        ON CONFLICT (period, shard, counter) DO UPDATE SET n = item_counts.n + excluded.n;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER item_counts_on_insert AFTER INSERT ON report_items
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION item_counts_add_inserted()
    """,
    f"""
    CREATE FUNCTION item_counts_remove_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE item_counts SET n = item_counts.n - tally.n
        FROM ({TALLY.format(rows="deleted")}) tally
        WHERE (item_counts.period, item_counts.shard, item_counts.counter) = (tally.period, tally.shard, tally.counter);
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER item_counts_on_delete AFTER DELETE ON report_items
    REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION item_counts_remove_deleted()
    """,
    f"""
    CREATE FUNCTION item_counts_move_state() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- Pending has no row: leaving it or entering it changes only the other side.
        UPDATE item_counts SET n = n - 1
        WHERE period = OLD.period AND shard = OLD.{SHARD} AND counter = OLD.state;
        IF NEW.state <> 'pending' THEN
            INSERT INTO item_counts (period, shard, counter, n) VALUES (NEW.period, NEW.{SHARD}, NEW.state, 1)
            ON CONFLICT (period, shard, counter) DO UPDATE SET n = item_counts.n + 1;
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER item_counts_on_state AFTER UPDATE OF state ON report_items
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION item_counts_move_state()
    """,
]

# SQLite has no statement triggers: every row adds to its counts. It serializes writers anyway.
SQLITE = [
    f"""
    CREATE TRIGGER item_counts_on_insert AFTER INSERT ON report_items BEGIN
        INSERT INTO item_counts (period, shard, counter, n)
        SELECT NEW.period, NEW.{SHARD}, counter, 1 FROM (SELECT 'recorded' AS counter UNION ALL SELECT NEW.state)
        WHERE counter <> 'pending'
        ON CONFLICT (period, shard, counter) DO UPDATE SET n = n + 1;
    END
    """,
    f"""
    CREATE TRIGGER item_counts_on_delete AFTER DELETE ON report_items BEGIN
        UPDATE item_counts SET n = n - 1
        WHERE period = OLD.period AND shard = OLD.{SHARD} AND counter IN ('recorded', OLD.state);
    END
    """,
    f"""
    CREATE TRIGGER item_counts_on_state AFTER UPDATE OF state ON report_items WHEN OLD.state IS NOT NEW.state BEGIN
        UPDATE item_counts SET n = n - 1
        WHERE period = OLD.period AND shard = OLD.{SHARD} AND counter = OLD.state;
        INSERT INTO item_counts (period, shard, counter, n)
        SELECT NEW.period, NEW.{SHARD}, NEW.state, 1 WHERE NEW.state <> 'pending'
        ON CONFLICT (period, shard, counter) DO UPDATE SET n = n + 1;
    END
    """,
]


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "item_counts",
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("shard", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("counter", sa.String(length=16), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("period", "shard", "counter", name=op.f("pk_item_counts")),
    )
    dialect = op.get_bind().dialect.name
    for statement in {"postgresql": POSTGRESQL, "sqlite": SQLITE}[dialect]:
        op.execute(statement)
    # The triggers lock out writers to report_items until this commits, so the items already
    # there are counted once: here, not by a trigger.
    op.execute(f"INSERT INTO item_counts (period, shard, counter, n) {TALLY.format(rows='report_items')}")


def downgrade() -> None:
    """Downgrade schema."""
    for trigger in ("item_counts_on_insert", "item_counts_on_delete", "item_counts_on_state"):
        op.execute(
            f"DROP TRIGGER {trigger} ON report_items"
            if op.get_bind().dialect.name == "postgresql"
            else f"DROP TRIGGER {trigger}"
        )
    if op.get_bind().dialect.name == "postgresql":
        for function in ("item_counts_add_inserted", "item_counts_remove_deleted", "item_counts_move_state"):
            op.execute(f"DROP FUNCTION {function}")
    op.drop_table("item_counts")
