"""When the scheduler triggers a period: strict settings, fire times across timezones, due periods."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from reports.errors import ConfigurationError
from reports.periods import Period
from reports.settings import Settings
from scheduler.schedule import (
    MAX_LOOKBACK_MONTHS,
    Schedule,
    check_lookback,
    due_periods,
    fire_time,
    parse_time,
    parse_timezone,
)

NEW_YORK = ZoneInfo("America/New_York")
TOKYO = ZoneInfo("Asia/Tokyo")


def periods(*texts: str) -> list[Period]:
    return [Period.parse(text) for text in texts]


# --- parse_time --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00:00", time(0, 0)),
        ("06:00", time(6, 0)),
        ("09:05", time(9, 5)),
        ("12:30", time(12, 30)),
        ("23:59", time(23, 59)),
    ],
)
def test_a_well_formed_time_is_parsed(text: str, expected: time) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("25:00", id="hour-25"),
        pytest.param("24:00", id="hour-24"),
        pytest.param("06:60", id="minute-60"),
        pytest.param("6:00", id="one-digit-hour"),
        pytest.param("06:0", id="one-digit-minute"),
        pytest.param("0600", id="no-colon"),
        pytest.param("06.00", id="dot"),
        pytest.param("06:00:00", id="seconds"),
        pytest.param("-1:00", id="negative"),
        pytest.param(" 06:00", id="leading-space"),
        pytest.param("06:00\n", id="trailing-newline"),
        pytest.param("6am", id="words"),
        pytest.param("", id="empty"),
        pytest.param("\u0660\u0666:\u0660\u0660", id="arabic-indic-digits"),
    ],
)
def test_a_malformed_time_is_a_configuration_error_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigurationError, match="SCHEDULE_TIME must be HH:MM"):
        parse_time(text)


# --- parse_timezone and check_lookback ---------------------------------------------------------


@pytest.mark.parametrize("name", ["UTC", "Europe/Paris", "America/New_York", "Asia/Tokyo"])
def test_an_iana_timezone_is_accepted(name: str) -> None:
    assert str(parse_timezone(name)) == name


@pytest.mark.parametrize("name", ["Mars/Base", "America", "utc", "../etc/passwd", "/usr/share/zoneinfo/UTC", "+02:00"])
def test_an_unknown_timezone_is_a_configuration_error_naming_the_variable(name: str) -> None:
    with pytest.raises(ConfigurationError, match="SCHEDULE_TIMEZONE must be an IANA time zone"):
        parse_timezone(name)


@pytest.mark.parametrize("months", [1, 3, MAX_LOOKBACK_MONTHS])
def test_a_lookback_within_bounds_is_accepted(months: int) -> None:
    assert check_lookback(months) == months


@pytest.mark.parametrize("months", [0, -1, MAX_LOOKBACK_MONTHS + 1, True])
def test_a_lookback_out_of_bounds_is_a_configuration_error(months: int) -> None:
    with pytest.raises(ConfigurationError, match="SCHEDULE_LOOKBACK_MONTHS"):
        check_lookback(months)


def test_the_schedule_is_validated_from_the_settings() -> None:
    schedule = Schedule.from_settings(
        Settings(schedule_time="07:15", schedule_timezone="Asia/Tokyo", schedule_lookback_months=2)
    )
    assert (schedule.at, str(schedule.timezone), schedule.lookback_months) == (time(7, 15), "Asia/Tokyo", 2)
    with pytest.raises(ConfigurationError, match="SCHEDULE_TIME"):
        Schedule.from_settings(Settings(schedule_time="25:00"))
    with pytest.raises(ConfigurationError, match="SCHEDULE_TIMEZONE"):
        Schedule.from_settings(Settings(schedule_timezone="Mars/Base"))


# --- fire_time ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "at", "tz", "expected"),
    [
        pytest.param("2026-10", time(6, 0), UTC, datetime(2026, 11, 1, 6, 0), id="utc"),
        pytest.param("2026-12", time(6, 0), UTC, datetime(2027, 1, 1, 6, 0), id="utc-new-year"),
        pytest.param("2026-10", time(0, 0), UTC, datetime(2026, 11, 1, 0, 0), id="utc-midnight"),
        # 2026: New York is on EDT (UTC-4) from March 8 to November 1 02:00, EST (UTC-5) otherwise.
        pytest.param("2026-02", time(6, 0), NEW_YORK, datetime(2026, 3, 1, 11, 0), id="new-york-est-before-dst"),
        pytest.param("2026-03", time(6, 0), NEW_YORK, datetime(2026, 4, 1, 10, 0), id="new-york-edt"),
        pytest.param("2026-09", time(6, 0), NEW_YORK, datetime(2026, 10, 1, 10, 0), id="new-york-edt-autumn"),
        pytest.param(
            "2026-10", time(6, 0), NEW_YORK, datetime(2026, 11, 1, 11, 0), id="new-york-fall-back-day-after-the-change"
        ),
        pytest.param(
            "2026-10",
            time(1, 30),
            NEW_YORK,
            datetime(2026, 11, 1, 5, 30),
            id="new-york-repeated-hour-reads-the-first-edt",
        ),
        pytest.param("2026-12", time(6, 0), NEW_YORK, datetime(2027, 1, 1, 11, 0), id="new-york-est-new-year"),
        # Tokyo is UTC+9 all year: the local 1st at 00:30 is the previous UTC day.
        pytest.param("2026-10", time(0, 30), TOKYO, datetime(2026, 10, 31, 15, 30), id="tokyo-previous-utc-day"),
        pytest.param("2026-12", time(0, 30), TOKYO, datetime(2026, 12, 31, 15, 30), id="tokyo-previous-utc-year"),
        pytest.param("2026-10", time(12, 0), TOKYO, datetime(2026, 11, 1, 3, 0), id="tokyo-noon"),
    ],
)
def test_the_fire_time_is_the_first_of_the_next_month_at_the_local_time_in_utc(
    period: str, at: time, tz, expected: datetime
) -> None:
    fired = fire_time(Period.parse(period), at, tz)
    assert fired == expected
    assert fired.tzinfo is None


# --- due_periods -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "at", "tz", "lookback", "expected"),
    [
        pytest.param(datetime(2026, 11, 1, 5, 59), time(6, 0), UTC, 1, [], id="the-1st-before-the-fire-time"),
        pytest.param(datetime(2026, 11, 1, 6, 0), time(6, 0), UTC, 1, ["2026-10"], id="the-1st-at-the-fire-time"),
        pytest.param(datetime(2026, 11, 1, 6, 1), time(6, 0), UTC, 1, ["2026-10"], id="the-1st-after-the-fire-time"),
        pytest.param(
            datetime(2026, 11, 1, 5, 59),
            time(6, 0),
            UTC,
            3,
            ["2026-08", "2026-09"],
            id="lookback-3-before-the-fire-time",
        ),
        pytest.param(
            datetime(2026, 11, 1, 6, 0),
            time(6, 0),
            UTC,
            3,
            ["2026-08", "2026-09", "2026-10"],
            id="lookback-3-after-the-fire-time-oldest-first",
        ),
        pytest.param(
            datetime(2026, 11, 15, 12, 0),
            time(6, 0),
            UTC,
            1,
            ["2026-10"],
            id="fresh-install-lookback-1-gets-only-last-month",
        ),
        pytest.param(
            datetime(2026, 11, 30, 23, 59, 59),
            time(0, 0),
            UTC,
            3,
            ["2026-08", "2026-09", "2026-10"],
            id="never-the-current-month",
        ),
        pytest.param(datetime(2027, 1, 1, 6, 0), time(6, 0), UTC, 2, ["2026-11", "2026-12"], id="across-new-year"),
        pytest.param(
            datetime(2027, 1, 1, 5, 0), time(6, 0), UTC, 2, ["2026-11"], id="across-new-year-before-the-fire-time"
        ),
        # New York after falling back: 06:00 EST is 11:00 UTC (10:30 UTC is 05:30 local).
        pytest.param(datetime(2026, 11, 1, 10, 30), time(6, 0), NEW_YORK, 1, [], id="new-york-est-not-yet"),
        pytest.param(datetime(2026, 11, 1, 11, 0), time(6, 0), NEW_YORK, 1, ["2026-10"], id="new-york-est-due"),
        pytest.param(datetime(2026, 10, 1, 9, 59), time(6, 0), NEW_YORK, 1, [], id="new-york-edt-not-yet"),
        pytest.param(datetime(2026, 10, 1, 10, 0), time(6, 0), NEW_YORK, 1, ["2026-09"], id="new-york-edt-due"),
        # Tokyo's 1st 00:30 is 15:30 UTC on the last day: October is not due until it has ended in UTC.
        pytest.param(
            datetime(2026, 10, 31, 15, 29), time(0, 30), TOKYO, 1, ["2026-09"], id="tokyo-before-the-fire-time"
        ),
        pytest.param(
            datetime(2026, 10, 31, 15, 30),
            time(0, 30),
            TOKYO,
            1,
            ["2026-09"],
            id="tokyo-fire-time-passed-but-utc-month-running",
        ),
        pytest.param(
            datetime(2026, 10, 31, 23, 59, 59),
            time(0, 30),
            TOKYO,
            1,
            ["2026-09"],
            id="tokyo-last-utc-second-of-the-month",
        ),
        pytest.param(
            datetime(2026, 11, 1, 0, 0), time(0, 30), TOKYO, 1, ["2026-10"], id="tokyo-due-once-the-utc-month-ended"
        ),
        pytest.param(
            datetime(2026, 11, 1, 6, 0, tzinfo=UTC), time(6, 0), UTC, 1, ["2026-10"], id="an-aware-now-is-read-in-utc"
        ),
    ],
)
def test_due_periods(now: datetime, at: time, tz, lookback: int, expected: list[str]) -> None:
    assert due_periods(now, at, tz, lookback) == periods(*expected)


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "Pacific/Kiritimati", "America/New_York", "Pacific/Pago_Pago"])
def test_the_current_utc_month_is_never_due_in_any_timezone(zone: str) -> None:
    tz = ZoneInfo(zone)
    last_day = datetime(2026, 10, 31)
    for minutes in range(0, 24 * 60, 15):
        now = last_day + timedelta(minutes=minutes)
        for at in (time(0, 0), time(6, 0), time(23, 59)):
            assert Period.parse("2026-10") not in due_periods(now, at, tz, 3)


def test_due_periods_rejects_a_lookback_of_zero() -> None:
    with pytest.raises(ConfigurationError):
        due_periods(datetime(2026, 11, 15), time(6, 0), UTC, 0)


def test_with_a_local_send_time_the_month_is_due_as_it_ends_whatever_schedule_time_says() -> None:
    schedule = Schedule.from_settings(Settings(schedule_time="06:00", send_at_local_time="09:00"))
    assert (schedule.at, schedule.timezone, schedule.at_month_end) == (time(0, 0), UTC, True)
    assert schedule.due_periods(datetime(2026, 10, 31, 23, 59, 59)) == periods("2026-09")
    assert schedule.due_periods(datetime(2026, 11, 1, 0, 0)) == periods("2026-10")
