"""The suppression list: users who get no monthly report (unsubscribed, bounced, complained)

Revision ID: 0007
Revises: 0006

One row per user, keyed by the user: the coordinator's page walk and the per-user read look it
up by primary key (``NOT EXISTS`` / ``LEFT JOIN``) inside the statements they already run. It goes
with its user when the user is deleted.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "suppressions",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_suppressions_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_suppressions")),
    )


def downgrade() -> None:
    op.drop_table("suppressions")
