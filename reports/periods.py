"""Report periods: calendar months in UTC, written ``YYYY-MM``. Pure functions, time passed in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from reports.errors import BadInput

_PERIOD = re.compile(r"([0-9]{4})-([0-9]{2})")

#: Earliest and latest years accepted: a typo such as ``0202-10`` is caught rather than planned,
#: and every accepted month has a next month that ``datetime`` can hold.
FIRST_YEAR = 1970
LAST_YEAR = 9998


@dataclass(frozen=True, order=True)
class Period:
    year: int
    month: int

    def __str__(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @classmethod
    def parse(cls, text: str) -> Period:
        """Parse ``YYYY-MM`` strictly; raise :class:`BadInput` for anything else."""
        match = _PERIOD.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise BadInput(f"Invalid period {text!r}: expected YYYY-MM, for example 2026-10.")
        year, month = int(match[1]), int(match[2])
        if not 1 <= month <= 12 or not FIRST_YEAR <= year <= LAST_YEAR:
            raise BadInput(f"Invalid period {text!r}: no such month.")
        return cls(year, month)

    @classmethod
    def containing(cls, moment: datetime) -> Period:
        return cls(moment.year, moment.month)

    @property
    def start(self) -> datetime:
        """First instant of the month, as a naive UTC datetime (the schema's timestamps)."""
        return datetime(self.year, self.month, 1)

    @property
    def end(self) -> datetime:
        """First instant of the next month (exclusive bound)."""
        return self.next().start

    def next(self) -> Period:
        return Period(self.year + self.month // 12, self.month % 12 + 1)

    def previous(self) -> Period:
        return Period(self.year - (self.month == 1), (self.month - 2) % 12 + 1)

    def label(self) -> str:
        """Human form, such as ``October 2026``."""
        return self.start.strftime("%B %Y")


def previous_month(now: datetime) -> Period:
    """The month that ended most recently at ``now`` (UTC)."""
    return Period.containing(now).previous()


def parse_closed(text: str, now: datetime) -> Period:
    """Parse a period that has already ended at ``now``; the current or a future month is rejected."""
    period = Period.parse(text)
    if period >= Period.containing(now):
        raise BadInput(
            f"Period {period} has not ended yet: the latest period that can be reported is {previous_month(now)}."
        )
    return period
