"""The coordinator's cursor starts before any user: NULL until the walk records its first page

Revision ID: 0011
Revises: 0010

A walk that began at ``id > 0`` never reached users whose id is 0 or negative. Runs that have not
recorded a page yet (cursor 0: the walk always began above it) start before any user too; a run
further on keeps its cursor.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The lowest 64-bit id: what a downgraded walk resumes after, so it still reaches (nearly) every user.
_LOWEST_ID = -(2**63)


def upgrade() -> None:
    with op.batch_alter_table("period_runs") as batch:
        batch.alter_column("cursor", existing_type=sa.BigInteger(), nullable=True)
    op.execute("UPDATE period_runs SET cursor = NULL WHERE cursor = 0")


def downgrade() -> None:
    op.execute(f"UPDATE period_runs SET cursor = {_LOWEST_ID} WHERE cursor IS NULL")
    with op.batch_alter_table("period_runs") as batch:
        batch.alter_column("cursor", existing_type=sa.BigInteger(), nullable=False)
