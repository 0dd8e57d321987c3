"""The brake on a month-wide rejection: permanent failures that are not about the address (the
message's size, its content, the sender's policy), for enough different users within a window,
pause the period, as ``reports cancel`` does.

Such a reply would refuse every user alike: without the brake the whole month is dead-lettered
in minutes. Counted fleet-wide in Redis, one sorted set per period (member: the user, score: the
time), so a message retried or run twice counts once. The caller that reaches the threshold
empties the set in the same call: one caller per trip pauses the period and raises the alert.

The trip holds for a window: a refusal that comes after it (from a message that read the period
as running before the pause was committed) is told how long it still holds, and its message waits
that out instead of dying; it then finds the period paused, or resumed and the count started
afresh. Only the refusals that tripped the brake die, however long the pause takes to commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import redis
from sqlalchemy import update
from sqlalchemy.orm import Session

from reports.models import PeriodRun, RunState
from reports.periods import Period

# KEYS: the period's set, its trip. ARGV: now ms, user id, window ms, threshold.
# Returns {count, held ms}: the count reached when this call trips the brake, {0, 0} when it does
# not; when the brake tripped within the window before this call, the trip's count and how long it
# still holds.
_NOTE = """
local held = redis.call('PTTL', KEYS[2])
if held > 0 then return {tonumber(redis.call('GET', KEYS[2])), held} end
local now = tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
local count = redis.call('ZCARD', KEYS[1])
if count >= tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], count, 'PX', ARGV[3])
  return {count, 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {0, 0}
"""


@dataclass(frozen=True)
class Tripped:
    """The brake went on for a period: what the alert says."""

    period: Period
    #: Different users refused within the window.
    failures: int
    window_seconds: float
    #: The last refusal, as the provider gave it (addresses masked).
    reply: str
    #: For a refusal after the trip, within its window: how long the trip still holds, in seconds
    #: (the refusal is the month's, not the user's); ``None`` for the refusal that tripped it.
    holds_for_seconds: float | None = None


class Brake:
    """Counts the period's permanent failures not about the address; says when they trip the brake.

    :param threshold: different users refused within ``window_seconds`` that trip it.
    :param alert: called once per trip, after the period is paused (a webhook post); ``None``: none.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str,
        threshold: int,
        window_seconds: float,
        alert: Callable[[Tripped], None] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.threshold = threshold
        self.window_seconds = window_seconds
        self.alert = alert
        self._note = client.register_script(_NOTE)

    def note(self, period: Period, user_id: int, reply: str, *, now_ms: float) -> Tripped | None:
        """Count one user's refusal; the trip when this one reaches the threshold or comes after it
        (:attr:`Tripped.holds_for_seconds`), else ``None``."""
        key = f"{self.namespace}:brake:{period}"
        count, held_ms = self._note(
            keys=[key, f"{key}:tripped"],
            args=[f"{now_ms:.0f}", user_id, int(self.window_seconds * 1000), self.threshold],
        )
        if not count:
            return None
        holds_for = int(held_ms) / 1000 if held_ms else None
        return Tripped(period, int(count), self.window_seconds, reply, holds_for_seconds=holds_for)


def pause(session: Session, period: Period, *, now: datetime) -> bool:
    """Cancel the period's run as ``reports cancel`` does (``reports trigger`` resumes it);
    ``False`` if it was cancelled already."""
    paused = session.execute(
        update(PeriodRun)
        .where(PeriodRun.period == str(period), PeriodRun.state == RunState.ACTIVE)
        .values(state=RunState.CANCELLED, updated_at=now)
        .returning(PeriodRun.period)
    ).first()
    return paused is not None
