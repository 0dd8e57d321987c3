"""initial schema

Revision ID: 0001
Revises:

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "deliveries",
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("user_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("claim_token", sa.String(length=36), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=False),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("period", "user_id", name=op.f("pk_deliveries")),
    )
    op.create_table(
        "period_runs",
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("template_version", sa.String(length=32), nullable=False),
        sa.Column("cursor", sa.BigInteger(), nullable=False),
        sa.Column("planned", sa.Boolean(), nullable=False),
        sa.Column("triggered_at", sa.DateTime(), nullable=False),
        sa.Column("planned_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("period", name=op.f("pk_period_runs")),
    )
    op.create_table(
        "report_items",
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("user_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("enqueued_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("period", "user_id", name=op.f("pk_report_items")),
    )
    with op.batch_alter_table("report_items", schema=None) as batch_op:
        batch_op.create_index("ix_report_items_period_state", ["period", "state"], unique=False)

    op.create_table(
        "reports",
        sa.Column("period", sa.String(length=7), nullable=False),
        sa.Column("user_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("template_version", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("body_text", sa.Text(), nullable=False),
        sa.Column("body_html", sa.Text(), nullable=False),
        sa.Column("rendered_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("period", "user_id", name=op.f("pk_reports")),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("email", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
    )
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.create_index(
            "ix_users_active_id",
            ["id"],
            unique=False,
            postgresql_where=sa.text("active"),
            sqlite_where=sa.text("active"),
        )

    op.create_table(
        "activities",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("occurred_at", sa.DateTime(), nullable=False),
        sa.Column("category", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_activities_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_activities")),
    )
    with op.batch_alter_table("activities", schema=None) as batch_op:
        batch_op.create_index("ix_activities_user_id_occurred_at", ["user_id", "occurred_at"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("activities", schema=None) as batch_op:
        batch_op.drop_index("ix_activities_user_id_occurred_at")

    op.drop_table("activities")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_index("ix_users_active_id", postgresql_where=sa.text("active"), sqlite_where=sa.text("active"))

    op.drop_table("users")
    op.drop_table("reports")
    with op.batch_alter_table("report_items", schema=None) as batch_op:
        batch_op.drop_index("ix_report_items_period_state")

    op.drop_table("report_items")
    op.drop_table("period_runs")
    op.drop_table("deliveries")
