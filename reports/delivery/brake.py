"""The brake on a month-wide rejection: permanent failures that are not about the address (the
message's size, its content, the sender's policy), for enough different users within a window,
pause the period, as ``reports cancel`` does.

Such a reply would refuse every user alike: without the brake the whole month is dead-lettered
in minutes. Counted fleet-wide in Redis, one sorted set per period (member: the user, score: the
time), so a message retried or run twice counts once. The caller that reaches the threshold
empties the set in the same call: one caller per trip pauses the period and raises the alert,
and after a resume the count starts afresh.
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

# KEYS: the period's set. ARGV: now ms, user id, window ms, threshold. Returns the count reached
# when this call trips the brake, else 0.
_NOTE = """
local now = tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
local count = redis.call('ZCARD', KEYS[1])
if count >= tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[1])
  return count
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 0
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
        """Count one user's refusal; the trip when this one reaches the threshold, else ``None``."""
        count = int(
            self._note(
                keys=[f"{self.namespace}:brake:{period}"],
                args=[f"{now_ms:.0f}", user_id, int(self.window_seconds * 1000), self.threshold],
            )
        )
        return Tripped(period, count, self.window_seconds, reply) if count else None


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
