"""Each user's own language and time zone: optional, so a load that leaves them out stays valid

Revision ID: 0009
Revises: 0008

``users.locale`` (BCP 47, such as ``tr`` or ``uz-Latn``) picks the words, numbers and months of the
user's report; a value no catalog writes falls back to ``REPORT_LOCALE``. ``users.time_zone`` (an
IANA name) is the user's zone.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable with no default: PostgreSQL adds them without rewriting the table.
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("time_zone", sa.Text(), nullable=True))
        batch.add_column(sa.Column("locale", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("locale")
        batch.drop_column("time_zone")
