"""Indexes of the dead letters not yet replayed

Revision ID: 0019
Revises: 0018

The console's dead-letters page, `reports dlq list` and the exporter look for the letters not yet
replayed, newest first or by period; replayed ones pile up month after month and stay. Without an
index of their own, each read walked every letter (with its traceback) and threw the replayed ones
away: at 300,000 letters a page took over a second and each scrape read the whole table.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNREPLAYED = text("replayed_at IS NULL")


def upgrade() -> None:
    for name, columns in (
        ("ix_dead_letters_unreplayed_id", ["id"]),
        ("ix_dead_letters_unreplayed_period_id", ["period", "id"]),
    ):
        op.create_index(name, "dead_letters", columns, postgresql_where=UNREPLAYED, sqlite_where=UNREPLAYED)


def downgrade() -> None:
    op.drop_index("ix_dead_letters_unreplayed_period_id", table_name="dead_letters")
    op.drop_index("ix_dead_letters_unreplayed_id", table_name="dead_letters")
