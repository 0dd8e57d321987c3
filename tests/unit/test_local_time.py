"""When each user's report is due: their morning on the 1st, by the zone rules the project pins."""

from __future__ import annotations

from datetime import datetime, time

import pytest

from reports.errors import ConfigurationError
from reports.local_time import SendSchedule, check_zone, due_at, parse_clock_time, zone_named
from reports.periods import Period

OCTOBER = Period.parse("2026-10")
NINE = time(9, 0)


@pytest.mark.parametrize(
    ("zone", "due"),
    [
        # West of UTC the 1st begins before the UTC month ends: 09:00 on the 1st.
        pytest.param("America/Los_Angeles", datetime(2026, 11, 1, 17, 0), id="los-angeles-after-its-dst-ended"),
        pytest.param("America/New_York", datetime(2026, 11, 1, 14, 0), id="new-york-after-its-dst-ended"),
        pytest.param("Pacific/Pago_Pago", datetime(2026, 11, 1, 20, 0), id="utc-minus-11"),
        pytest.param("UTC", datetime(2026, 11, 1, 9, 0), id="utc"),
        pytest.param("Europe/Istanbul", datetime(2026, 11, 1, 6, 0), id="istanbul"),
        pytest.param("Asia/Tashkent", datetime(2026, 11, 1, 4, 0), id="tashkent"),
        pytest.param("Asia/Kolkata", datetime(2026, 11, 1, 3, 30), id="half-hour-offset"),
        # 09:00 in Tokyo is the instant the UTC month ends: still the 1st.
        pytest.param("Asia/Tokyo", datetime(2026, 11, 1, 0, 0), id="tokyo-at-the-month-end"),
        # Further east the 1st's 09:00 comes while October still runs in UTC: the 2nd.
        pytest.param("Australia/Sydney", datetime(2026, 11, 1, 22, 0), id="sydney-the-2nd"),
        pytest.param("Pacific/Kiritimati", datetime(2026, 11, 1, 19, 0), id="kiritimati-the-2nd"),
    ],
)
def test_a_report_is_due_at_nine_on_the_users_clock_on_the_first_after_the_month(zone: str, due: datetime) -> None:
    assert due_at(OCTOBER, NINE, check_zone(zone, "ZONE")) == due


def test_a_daylight_saving_change_between_the_month_end_and_the_morning_is_followed() -> None:
    # Los Angeles leaves daylight saving at 02:00 on 1 November 2026: its 09:00 that day is UTC-8,
    # an hour later in UTC than the offset in force when October ended.
    zone = check_zone("America/Los_Angeles", "ZONE")
    assert OCTOBER.end.replace(tzinfo=None) == datetime(2026, 11, 1)
    assert (
        datetime(2026, 10, 31, 17, 0).astimezone(zone).utcoffset()
        != datetime(2026, 11, 1, 17).astimezone(zone).utcoffset()
    )
    assert due_at(OCTOBER, NINE, zone) == datetime(2026, 11, 1, 17, 0)


def test_a_time_a_daylight_saving_change_skips_is_read_with_the_offset_before_the_change() -> None:
    # Easter Island moves its clocks from 22:00 to 23:00 on 1 September 2029: 22:30 that evening
    # never shows. Read at the offset before the change (UTC-6), it is the same instant as 23:30.
    zone = check_zone("Pacific/Easter", "ZONE")
    august = Period.parse("2029-08")
    assert due_at(august, time(21, 30), zone) == datetime(2029, 9, 2, 3, 30)
    assert due_at(august, time(22, 30), zone) == datetime(2029, 9, 2, 4, 30)
    assert due_at(august, time(23, 30), zone) == datetime(2029, 9, 2, 4, 30)


@pytest.mark.parametrize("text", ["9:00", "09:0", "24:00", "09:60", "0900", "09:00 ", "٠٩:٠٠", ""])
def test_a_send_time_must_be_hh_mm_on_a_24_hour_clock(text: str) -> None:
    with pytest.raises(ConfigurationError, match="SEND_AT_LOCAL_TIME must be HH:MM"):
        parse_clock_time(text, "SEND_AT_LOCAL_TIME")


@pytest.mark.parametrize("name", ["Mars/Olympus", "../../etc/passwd", "/etc/localtime", "utc", "Asia/", "", None])
def test_a_name_tzdata_does_not_know_is_no_zone(name: str | None) -> None:
    assert zone_named(name) is None


def test_zones_come_from_the_pinned_tzdata_and_are_kept() -> None:
    assert zone_named("Asia/Tashkent") is zone_named("Asia/Tashkent")
    assert str(zone_named("Asia/Tashkent")) == "Asia/Tashkent"


def test_an_unknown_zone_falls_back_to_the_default_and_says_so_an_unset_one_does_not() -> None:
    schedule = SendSchedule(NINE, "Asia/Tashkent")
    tashkent = datetime(2026, 11, 1, 4, 0)
    assert schedule.due_at(OCTOBER, "Europe/Istanbul") == (datetime(2026, 11, 1, 6, 0), False)
    assert schedule.due_at(OCTOBER, "Mars/Olympus") == (tashkent, True)
    assert schedule.due_at(OCTOBER, None) == (tashkent, False)


def test_a_zone_with_spaces_around_it_is_that_zone_and_an_empty_one_is_unset() -> None:
    schedule = SendSchedule(NINE, "Asia/Tashkent")
    istanbul = (datetime(2026, 11, 1, 6, 0), False)
    assert schedule.due_at(OCTOBER, " Europe/Istanbul") == istanbul
    assert schedule.due_at(OCTOBER, "Europe/Istanbul\r") == istanbul
    assert schedule.due_at(OCTOBER, "") == (datetime(2026, 11, 1, 4, 0), False)


def test_a_run_without_a_send_time_has_no_schedule() -> None:
    assert SendSchedule.parse(None, "UTC") is None
    assert SendSchedule.parse("", "UTC") is None
    assert SendSchedule.parse("09:00", None) == SendSchedule(NINE, "UTC")
    assert SendSchedule(NINE, "UTC").at_text == "09:00"
