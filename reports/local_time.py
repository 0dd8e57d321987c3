"""Local times of day and IANA time zones: when a user's report is due in their morning.

Pure functions, time passed in. Zones are read from the ``tzdata`` package the project pins, never
from the machine's own zone files, so every process computes the same due times whatever its OS
ships.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta, tzinfo
from functools import cache
from importlib import resources
from zoneinfo import ZoneInfo

from reports.errors import ConfigurationError
from reports.periods import Period

#: ``HH:MM`` on a 24-hour clock, ASCII digits only, both fields zero-padded.
_CLOCK_TIME = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")


def parse_clock_time(text: str, variable: str) -> time:
    """Parse ``HH:MM`` (``00:00`` to ``23:59``) strictly; anything else is a
    :class:`ConfigurationError` naming ``variable``."""
    match = _CLOCK_TIME.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigurationError(f"{variable} must be HH:MM on a 24-hour clock (00:00 to 23:59), got {text!r}.")
    return time(int(match[1]), int(match[2]))


@cache
def zone_names() -> frozenset[str]:
    """Every zone name the pinned ``tzdata`` knows (``Asia/Tashkent``, ``UTC``, links included)."""
    return frozenset(resources.files("tzdata").joinpath("zones").read_text(encoding="ascii").split())


@cache
def _zone(name: str) -> ZoneInfo:
    with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def zone_named(name: str | None) -> ZoneInfo | None:
    """The zone called ``name``, or ``None`` for a name ``tzdata`` does not know (or none at all).

    Only known names are loaded and kept, so a stored value that is not a zone never reaches the
    file system and cannot grow the cache.
    """
    if name is None or name not in zone_names():
        return None
    return _zone(name)


def check_zone(name: str, variable: str) -> ZoneInfo:
    """The zone ``name``, or a :class:`ConfigurationError` naming ``variable``."""
    zone = zone_named(name)
    if zone is None:
        raise ConfigurationError(
            f"{variable} must be an IANA time zone name such as UTC or Asia/Tashkent, got {name!r}."
        )
    return zone


def due_at(period: Period, at: time, zone: tzinfo) -> datetime:
    """When a report of ``period`` is due for a user in ``zone``: ``at`` on their clock on the 1st
    of the next month (naive UTC, like every timestamp in the schema).

    Far enough east (09:00 from UTC+9:01: Sydney, Kiritimati) that moment comes while the month is
    still running in UTC, and a report then would miss its last hours: it is due at ``at`` on the
    2nd instead. A local time that a daylight-saving change skips or repeats is read with
    ``fold=0``, as :mod:`zoneinfo` does: the offset in force before the change.
    """
    end = period.end.replace(tzinfo=UTC)
    due = datetime.combine(period.end.date(), at, tzinfo=zone)
    if due < end:
        due += timedelta(days=1)
    return due.astimezone(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class SendSchedule:
    """When a run's reports are due: at ``at`` on each user's own clock (see :func:`due_at`)."""

    at: time
    #: The zone of a user with none, or with a name ``tzdata`` does not know.
    default_zone: str

    @classmethod
    def parse(cls, at: str | None, default_zone: str | None) -> SendSchedule | None:
        """The schedule a run keeps as text (``HH:MM`` and a zone name); ``None`` when it has no send time."""
        if not at:
            return None
        return cls(parse_clock_time(at, "SEND_AT_LOCAL_TIME"), default_zone or "UTC")

    @property
    def at_text(self) -> str:
        return self.at.strftime("%H:%M")

    def due_at(self, period: Period, zone_name: str | None) -> tuple[datetime, bool]:
        """When ``period``'s report is due for a user whose zone is ``zone_name``, and whether an
        unknown name fell back to the default (an unset one is no fallback).

        Spaces around the name (a CSV load leaves a ``\\r``) are not part of it, and an empty one is
        unset, as for a user's locale: either would otherwise put the user an hour or more off.
        """
        name = (zone_name or "").strip() or None
        zone = zone_named(name)
        fell_back = zone is None and name is not None
        return due_at(period, self.at, zone or check_zone(self.default_zone, "DEFAULT_TIME_ZONE")), fell_back
