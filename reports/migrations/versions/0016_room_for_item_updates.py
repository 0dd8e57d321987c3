"""Room in each page of the items' partitions for the updates an item gets before its send

Revision ID: 0016
Revises: 0015

An item's row is written by the walk, then updated when its message is handed out and again when
the message claims it, neither changing a column that any of its four indexes reads. PostgreSQL
makes such an update in place on the same page (HOT), with no new index entry, but only when the
page has room; a page the walk filled has none, so most of these updates wrote a new row version
elsewhere and an entry in every index. Each month's ``report_items`` partition now leaves half of
its pages free (``fillfactor = 50``). Partitions made from now on get it from reports/partitions.py;
this sets it on those that exist, for the pages they write from now on. On SQLite nothing changes.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _item_partitions() -> list[str]:
    return list(
        op.get_bind().scalars(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'report_items'::regclass ORDER BY 1"
            )
        )
    )


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for partition in _item_partitions():
        op.execute(f"ALTER TABLE {partition} SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for partition in _item_partitions():
        op.execute(f"ALTER TABLE {partition} RESET (fillfactor)")
