"""Only pending items in the index of items by state

Revision ID: 0017
Revises: 0016

Every query that looked items up by state looks for pending ones: reconcile's walk by user, the
unfinished runs, the items never handed out. The index on (period, state, user_id) also held every
delivered, skipped and dead item, and a delivered item wrote its entry there as it finished (a
change of state writes a new row version, and an entry in each index that holds it). A partial
index of pending items alone answers the same queries, and a finishing item writes nothing to it:
one index entry fewer per report, and an index that empties as the month is sent.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = text("state = 'pending'")


def upgrade() -> None:
    op.create_index(
        "ix_report_items_pending_user_id",
        "report_items",
        ["period", "user_id"],
        postgresql_where=PENDING,
        sqlite_where=PENDING,
    )
    op.drop_index("ix_report_items_period_state_user_id", table_name="report_items")


def downgrade() -> None:
    op.create_index("ix_report_items_period_state_user_id", "report_items", ["period", "state", "user_id"])
    op.drop_index("ix_report_items_pending_user_id", table_name="report_items")
