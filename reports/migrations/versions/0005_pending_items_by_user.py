"""pending items indexed by user

Revision ID: 0005
Revises: 0004

Without statistics on report_items (before any ANALYZE: autovacuum off, or not yet run after the
coordinator's inserts), PostgreSQL estimated "this user's pending item" as cheaply found through
the (period, state) index as through the primary key, chose it, and read every pending entry of
the period for each report. With user_id as the index's last column, whichever index the planner
takes finds the one entry; reconcile's walk of a period's pending items, by user, uses it as before.
"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index("ix_report_items_period_state_user_id", "report_items", ["period", "state", "user_id"])
    op.drop_index("ix_report_items_period_state", table_name="report_items")


def downgrade() -> None:
    """Downgrade schema."""
    op.create_index("ix_report_items_period_state", "report_items", ["period", "state"])
    op.drop_index("ix_report_items_period_state_user_id", table_name="report_items")
