"""The socket timeout each SMTP read or write gets from what is left of the send's deadline."""

from __future__ import annotations

import pytest

from reports.delivery.mail.smtp import TIMEOUT_SLACK, socket_timeout


@pytest.mark.parametrize("left", [10.0, 2.0, 0.05])
def test_a_timeout_within_the_slack_below_the_time_left_is_kept(left: float) -> None:
    assert socket_timeout(left, left) is None
    assert socket_timeout(left * (1 - TIMEOUT_SLACK), left) is None


@pytest.mark.parametrize(
    ("current", "left"),
    [
        pytest.param(10.0, 9.0, id="would-outlive-the-deadline"),
        pytest.param(0.4, 10.0, id="set-late-in-an-earlier-send"),
        pytest.param(None, 10.0, id="blocking"),
        pytest.param(0.0, 10.0, id="non-blocking"),
    ],
)
def test_a_timeout_past_the_deadline_or_well_short_of_it_is_set_again(current: float | None, left: float) -> None:
    timeout = socket_timeout(current, left)
    assert timeout is not None
    assert left * (1 - TIMEOUT_SLACK) <= timeout <= left
    assert socket_timeout(timeout, left) is None  # and serves the next read at once


def test_reads_moments_apart_share_one_timeout_until_the_deadline_nears_it() -> None:
    deadline, now = 10.0, 0.0
    current = socket_timeout(None, deadline - now)
    settings = 1
    while now < deadline - 0.01:
        now += 0.001
        new = socket_timeout(current, deadline - now)
        if new is not None:
            current, settings = new, settings + 1
        assert current is not None and current <= deadline - now
    assert settings < 500  # of about 10,000 reads, each of which set one before
