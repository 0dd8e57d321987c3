"""Months relative to the current one."""

from __future__ import annotations

from datetime import UTC, datetime


def month_from_now(offset: int) -> str:
    """``YYYY-MM`` of the UTC month ``offset`` months from the current one (negative: the past)."""
    now = datetime.now(UTC)
    index = now.year * 12 + now.month - 1 + offset
    return f"{index // 12:04d}-{index % 12 + 1:02d}"
