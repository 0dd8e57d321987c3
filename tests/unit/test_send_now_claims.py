"""Whether a send-now is the period's monthly email: decided from the run and the user's item alone."""

from __future__ import annotations

import pytest

from reports.delivery import claims
from reports.models import ItemState


@pytest.mark.parametrize(
    ("planned", "item_state", "may_follow"),
    [
        # Never triggered, or the walk has not reached the user yet: a monthly email is to come.
        (None, None, True),
        (False, None, True),
        (False, ItemState.PENDING, True),
        (True, ItemState.PENDING, True),
        # Dead: a replay may still send it.
        (True, ItemState.DEAD, True),
        # Settled: it went out, or the user was skipped.
        (True, ItemState.DELIVERED, False),
        (False, ItemState.DELIVERED, False),
        (True, ItemState.SKIPPED, False),
        # A walk that is done and no item: the user was not planned, or the item was pruned.
        (True, None, False),
    ],
)
def test_a_send_now_stands_in_for_the_monthly_email_only_while_one_may_still_go_out(
    planned, item_state, may_follow
) -> None:
    assert claims.monthly_may_follow(planned=planned, item_state=item_state) is may_follow
