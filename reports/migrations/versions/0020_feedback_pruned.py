"""Counts of the feedback events a prune deleted

Revision ID: 0020
Revises: 0019

Provider feedback events (each with the address it was about) were kept for ever. A prune now
deletes the ones older than the months kept, and adds them here, by provider and kind, so that
the exporter's event counters (stored plus pruned) never go down.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feedback_pruned",
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("unmatched", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("provider", "kind", name=op.f("pk_feedback_pruned")),
    )


def downgrade() -> None:
    op.drop_table("feedback_pruned")
