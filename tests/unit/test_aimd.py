"""The fleet's rate following the provider: one cut per overload, below the pace the provider
was seen to accept, then a steady climb back to the ceiling."""

from __future__ import annotations

import pytest

from reports.delivery import aimd

T0 = 1_800_000_000_000.0


def test_a_first_refusal_cuts_below_what_the_fleet_was_sending_not_below_the_ceiling() -> None:
    cut = aimd.after_refusal(None, now_ms=T0, observed_per_second=40.0, ceiling=100.0)
    assert cut is not None
    assert cut.per_second == pytest.approx(40.0 * aimd.DECREASE)
    assert (cut.cut_ms, cut.fresh, cut.successes) == (T0, False, 0)


def test_with_no_ceiling_and_nothing_observed_the_first_cut_starts_from_a_low_rate() -> None:
    cut = aimd.after_refusal(None, now_ms=T0, observed_per_second=None, ceiling=None)
    assert cut is not None and cut.per_second == pytest.approx(aimd.START_PER_SECOND * aimd.DECREASE)


def test_refusals_before_a_success_after_the_cut_are_the_same_overload_and_cut_nothing_more() -> None:
    cut = aimd.after_refusal(None, now_ms=T0, observed_per_second=40.0, ceiling=None)
    assert cut is not None
    assert aimd.after_refusal(cut, now_ms=T0 + 3000, observed_per_second=40.0, ceiling=None) is None
    # A send admitted before the cut succeeding does not show the cut rate is accepted.
    late = aimd.after_success(cut, sent_at_ms=T0 - 1, ceiling=None)
    assert late is not None and not late.fresh and late.per_second == cut.per_second
    assert aimd.after_refusal(late, now_ms=T0 + 3000, observed_per_second=40.0, ceiling=None) is None


def test_the_next_cut_goes_below_the_pace_the_provider_accepted_since_the_last_one() -> None:
    state = aimd.after_refusal(None, now_ms=T0, observed_per_second=100.0, ceiling=None)
    assert state is not None
    # 50 accepted in the 10 s to the next refusal: the provider's pace is 5 a second.
    for i in range(50):
        state = aimd.after_success(state, sent_at_ms=T0 + 1 + i, ceiling=None)
        assert state is not None
    cut = aimd.after_refusal(state, now_ms=T0 + 10_000, observed_per_second=100.0, ceiling=None)
    assert cut is not None and cut.per_second == pytest.approx(5.0 * aimd.DECREASE)


def test_successes_raise_the_rate_by_about_the_cut_in_the_recovery_time_and_the_ceiling_ends_it() -> None:
    state = aimd.after_refusal(None, now_ms=T0, observed_per_second=20.0, ceiling=20.0)
    assert state is not None
    start = state.per_second
    # One second of sending at the rate: about ``per_second`` successes.
    for _ in range(round(start)):
        state = aimd.after_success(state, sent_at_ms=T0 + 1, ceiling=20.0)
        assert state is not None
    assert state.fresh
    assert state.per_second - start == pytest.approx((20.0 - start) / aimd.RECOVERY_SECONDS, rel=0.1)
    while state is not None:
        state = aimd.after_success(state, sent_at_ms=T0 + 1, ceiling=20.0)
    # Back at the ceiling: the state is dropped, and the ceiling rules again.


def test_the_rate_never_falls_below_the_floor() -> None:
    state = aimd.after_refusal(None, now_ms=T0, observed_per_second=0.01, ceiling=None)
    assert state is not None and state.per_second == aimd.FLOOR_PER_SECOND
