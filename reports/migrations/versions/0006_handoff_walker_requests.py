"""The coordinator's chain and pause, and send-now requests recorded when they are made

Revision ID: 0006
Revises: 0005

* ``period_runs.walker``: the coordinator chain that may walk the period; a chain whose token
  is not this one stops at its next slice, so a second chain (a repeated trigger, a resume, a
  reconcile) never doubles the walk.
* ``period_runs.paused_at``: when the walk last paused on the bulk queue's high-water mark, so a
  paused walk reads as paused, not idle.
* ``resends.template_version`` and ``resends.updated_at``: a request is written when it is made
  and carries what reconcile needs to send it again if its message is lost.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("period_runs", sa.Column("walker", sa.String(length=36), nullable=True))
    op.add_column("period_runs", sa.Column("paused_at", sa.DateTime(), nullable=True))
    op.add_column("resends", sa.Column("template_version", sa.String(length=32), nullable=True))
    op.add_column("resends", sa.Column("updated_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("resends") as batch:
        batch.drop_column("updated_at")
        batch.drop_column("template_version")
    with op.batch_alter_table("period_runs") as batch:
        batch.drop_column("paused_at")
        batch.drop_column("walker")
