"""When a period's run is due. Pure functions, time passed in: no clock, no database, no broker.

A period (a calendar month in UTC) is due at its *fire time*, the 1st of the following month at
``SCHEDULE_TIME`` in ``SCHEDULE_TIMEZONE``, but never before the month has ended in UTC: east of
UTC the local 1st begins while the UTC month is still running, and a run triggered then would
miss that month's last hours of activity.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, tzinfo

from reports.errors import ConfigurationError
from reports.local_time import check_zone, parse_clock_time
from reports.periods import Period
from reports.settings import MAX_LOOKBACK_MONTHS, Settings


@dataclass(frozen=True)
class Schedule:
    """The scheduler's validated configuration."""

    #: Local time of day on the 1st at which the month that just ended is triggered.
    at: time
    timezone: tzinfo
    #: How many past months the catch-up considers (the most recent closed month is the first).
    lookback_months: int
    #: The month is triggered as it ends in UTC, whatever ``SCHEDULE_TIME`` says: with
    #: ``SEND_AT_LOCAL_TIME`` each report waits for its user's morning, the first of which comes
    #: then (09:00 in Tokyo is 00:00 UTC), and a later trigger would make those users' reports late.
    at_month_end: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> Schedule:
        """Validate the schedule settings; :class:`ConfigurationError` names the variable to fix."""
        at, timezone = parse_time(settings.schedule_time), parse_timezone(settings.schedule_timezone)
        at_month_end = bool(settings.send_at_local_time)
        return cls(
            at=time(0, 0) if at_month_end else at,
            timezone=UTC if at_month_end else timezone,
            lookback_months=check_lookback(settings.schedule_lookback_months),
            at_month_end=at_month_end,
        )

    def due_periods(self, now_utc: datetime) -> list[Period]:
        return due_periods(now_utc, self.at, self.timezone, self.lookback_months)


def parse_time(text: str) -> time:
    """Parse ``HH:MM`` (``00:00`` to ``23:59``) strictly; anything else is a :class:`ConfigurationError`."""
    return parse_clock_time(text, "SCHEDULE_TIME")


def parse_timezone(name: str) -> tzinfo:
    """The IANA timezone ``name`` (such as ``Europe/Paris``); :class:`ConfigurationError` if unknown."""
    return check_zone(name, "SCHEDULE_TIMEZONE")


def check_lookback(months: int) -> int:
    """``months`` if it is a valid look-back, else :class:`ConfigurationError`.

    At least 1: the most recent closed month is part of the window, or nothing would ever be due.
    """
    if isinstance(months, bool) or not isinstance(months, int) or not 1 <= months <= MAX_LOOKBACK_MONTHS:
        raise ConfigurationError(
            f"SCHEDULE_LOOKBACK_MONTHS must be a whole number of months from 1 to {MAX_LOOKBACK_MONTHS}, "
            f"got {months!r}."
        )
    return months


def fire_time(period: Period, at: time, tz: tzinfo) -> datetime:
    """When ``period``'s run is due by the clock: the 1st of the next month at ``at`` in ``tz``.

    Returned as a naive UTC datetime, like every timestamp in the schema. A local time that a
    daylight-saving change skips or repeats is read with ``fold=0`` (the offset in force before
    the change), as :mod:`zoneinfo` does.
    """
    local = datetime.combine(period.end.date(), at.replace(tzinfo=None), tzinfo=tz)
    return local.astimezone(UTC).replace(tzinfo=None)


def due_periods(now_utc: datetime, at: time, tz: tzinfo, lookback_months: int) -> list[Period]:
    """The periods due at ``now_utc``, oldest first.

    They are among the last ``lookback_months`` months that have ended in UTC (the current UTC
    month is never one of them, whatever ``tz``), and their fire time has passed.

    :param now_utc: the current time, naive UTC (an aware datetime is converted).
    :param lookback_months: how many closed months to consider, from 1.
    """
    if now_utc.tzinfo is not None:
        now_utc = now_utc.astimezone(UTC).replace(tzinfo=None)
    check_lookback(lookback_months)
    due: list[Period] = []
    period = Period.containing(now_utc)
    for _ in range(lookback_months):
        period = period.previous()
        if fire_time(period, at, tz) <= now_utc:
            due.append(period)
    return sorted(due)
