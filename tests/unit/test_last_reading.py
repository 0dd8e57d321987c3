"""The reading a process trusts for a while: how long, and which of two answers it keeps."""

from __future__ import annotations

from reports.delivery.reading import LastReading
from tests.support.clocks import FakeClock


def test_an_answer_is_trusted_for_the_trust_after_its_call_was_sent() -> None:
    clock = FakeClock()
    reading: LastReading[str] = LastReading(250, clock)
    assert reading.fresh() is None
    sent_at = clock()
    clock.advance_ms(50)  # the round trip
    reading.remember("closed", sent_at)
    clock.advance_ms(190)  # 240 ms after the call was sent
    assert reading.fresh() == "closed"
    clock.advance_ms(20)  # 260 ms after
    assert reading.fresh() is None


def test_an_answer_to_an_earlier_call_never_replaces_one_to_a_later_call() -> None:
    clock = FakeClock()
    reading: LastReading[str] = LastReading(250, clock)
    earlier = clock()
    clock.advance_ms(10)
    reading.remember("open", clock())
    reading.remember("closed", earlier)  # its reply arrived last
    assert reading.fresh() == "open"


def test_with_no_trust_nothing_is_ever_fresh() -> None:
    clock = FakeClock()
    reading: LastReading[str] = LastReading(0, clock)
    reading.remember("closed", clock())
    assert reading.fresh() is None
