"""The fleet's send rate, adjusted to what the provider accepts: additive increase, multiplicative
decrease (AIMD, as TCP finds a path's capacity). Pure: the state is a value, times are passed in.

A refusal about the sending rate (:mod:`reports.delivery.mail.replies`) cuts the rate once per
overload: refusals that follow before any send made after the cut has succeeded are the same
overload (a provider counting per window keeps refusing until its window ends, whatever the
rate), so they cut nothing more. The cut goes below what the provider was seen to accept since
the previous cut, which is close to its pace whatever the rate was; then every success adds a
little, so that the rate regains the cut in about ``RECOVERY_SECONDS`` and probes upwards.
``SEND_RATE_PER_SECOND`` stays the ceiling: back at it, the state is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

#: What a cut keeps of the rate: 0.85 trades a sixth of the overload's pace for fewer refusals.
DECREASE = 0.85
#: Seconds of successful sending in which the rate regains what a cut took from it.
RECOVERY_SECONDS = 10.0
#: Successes since the previous cut needed before their pace is trusted as the provider's.
MIN_SUCCESSES = 5
#: The least a second of successful sending adds to the rate, in emails per second: a cut from a
#: low estimate still climbs back within minutes.
MIN_STEP = 0.1
#: The slowest the fleet is ever held to, in emails per second.
FLOOR_PER_SECOND = 0.1
#: The rate assumed when a refusal comes before any send was counted, in emails per second.
START_PER_SECOND = 1.0


@dataclass(frozen=True)
class Adapted:
    """The fleet's send rate while it follows the provider."""

    #: Emails per second.
    per_second: float
    #: Emails per second gained per second of successful sending.
    step: float
    #: When the rate was last cut, in epoch milliseconds.
    cut_ms: float
    #: Whether a send made after the cut has succeeded: only then may the next refusal cut again.
    fresh: bool = False
    #: Successes since the cut.
    successes: int = 0


def after_refusal(
    state: Adapted | None, *, now_ms: float, observed_per_second: float | None, ceiling: float | None
) -> Adapted | None:
    """The rate after a refusal about the rate at ``now_ms``; ``None``: unchanged (the same overload).

    :param observed_per_second: sends the fleet made a second lately (the first cut's measure).
    :param ceiling: SEND_RATE_PER_SECOND, or ``None`` for none.
    """
    if state is not None and not state.fresh:
        return None
    if state is None:
        limits = [x for x in (ceiling, observed_per_second) if x]
        base = min(limits) if limits else START_PER_SECOND
    else:
        base = state.per_second
        elapsed_s = (now_ms - state.cut_ms) / 1000
        if state.successes >= MIN_SUCCESSES and elapsed_s > 0:
            base = min(base, state.successes / elapsed_s)
    return Adapted(
        per_second=max(FLOOR_PER_SECOND, base * DECREASE),
        step=max((1 - DECREASE) * base / RECOVERY_SECONDS, MIN_STEP),
        cut_ms=now_ms,
    )


def after_success(state: Adapted, *, sent_at_ms: float, ceiling: float | None) -> Adapted | None:
    """The rate after a send that the provider accepted; ``None``: back at the ceiling.

    :param sent_at_ms: when the send was admitted: a send from before the cut counts towards the
        provider's pace but does not show that the cut rate is accepted.
    """
    fresh = state.fresh or sent_at_ms > state.cut_ms
    per_second = state.per_second + state.step / state.per_second if fresh else state.per_second
    if per_second >= (ceiling or math.inf):
        return None
    return replace(state, per_second=per_second, fresh=fresh, successes=state.successes + 1)
