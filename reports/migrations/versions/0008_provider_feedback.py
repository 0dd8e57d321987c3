"""Provider feedback: the webhook events received, the users they matched, the signature tokens
used once, which provider event suppressed a user, and users found by address

Revision ID: 0008
Revises: 0007

The index on ``lower(users.email)`` finds the users a bounce or complaint names, whatever the case
of the address; on a large ``users`` table it takes a while to build, and PostgreSQL holds writes
to ``users`` meanwhile.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feedback_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback_events")),
        sa.UniqueConstraint("provider", "event_id", name=op.f("uq_feedback_events_provider")),
    )
    op.create_index("ix_feedback_events_received_at", "feedback_events", ["received_at"])
    op.create_table(
        "feedback_matches",
        sa.Column("event", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("period", sa.String(length=7), nullable=True),
        sa.Column("dismissed_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["event"],
            ["feedback_events.id"],
            name=op.f("fk_feedback_matches_event_feedback_events"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_feedback_matches_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("event", "user_id", name=op.f("pk_feedback_matches")),
    )
    op.create_index("ix_feedback_matches_user_id", "feedback_matches", ["user_id"])
    op.create_index("ix_feedback_matches_period", "feedback_matches", ["period"])
    op.create_table(
        "webhook_tokens",
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("token", sa.String(length=200), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("provider", "token", name=op.f("pk_webhook_tokens")),
    )
    op.create_index("ix_webhook_tokens_seen_at", "webhook_tokens", ["seen_at"])
    with op.batch_alter_table("suppressions") as batch:
        batch.add_column(sa.Column("provider", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("event_id", sa.Text(), nullable=True))
    op.create_index("ix_users_email_lower", "users", [sa.text("lower(email)")])


def downgrade() -> None:
    op.drop_index("ix_users_email_lower", table_name="users")
    with op.batch_alter_table("suppressions") as batch:
        batch.drop_column("event_id")
        batch.drop_column("provider")
    op.drop_table("webhook_tokens")
    op.drop_table("feedback_matches")
    op.drop_table("feedback_events")
