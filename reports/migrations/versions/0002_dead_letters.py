"""dead letters

Revision ID: 0002
Revises: 0001

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("period", sa.String(length=7), nullable=True),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("error_class", sa.Text(), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("first_failed_at", sa.DateTime(), nullable=False),
        sa.Column("died_at", sa.DateTime(), nullable=False),
        sa.Column("replayed_at", sa.DateTime(), nullable=True),
        sa.Column("replay_message_id", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
        sa.UniqueConstraint("message_id", name=op.f("uq_dead_letters_message_id")),
    )
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.create_index("ix_dead_letters_died_at", ["died_at"], unique=False)
        batch_op.create_index("ix_dead_letters_period", ["period"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("dead_letters", schema=None) as batch_op:
        batch_op.drop_index("ix_dead_letters_period")
        batch_op.drop_index("ix_dead_letters_died_at")

    op.drop_table("dead_letters")
