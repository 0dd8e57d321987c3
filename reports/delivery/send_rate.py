"""A fleet-wide send rate: a GCRA limiter in Redis, shared by every worker on every machine.

Every send asks :meth:`SendRate.acquire` first; one Lua script decides, so the fleet agrees without
a lock. A caller that will wait books its slot in the same call; one whose wait is longer than it
will sleep books nothing and is deferred (docs/explanation/failures.md, "The send rate is
fleet-wide"). Times are milliseconds passed in by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from reports import counters
from reports.outcome import Outcome

#: Name of the fleet-wide counter of throttled sends, by outcome (``waited``, ``deferred``).
THROTTLED_COUNTER = "send_throttled"


class ThrottleOutcome(enum.StrEnum):
    """Outcomes of a throttled send, the label values of ``reports_send_throttled_total``."""

    WAITED = "waited"
    DEFERRED = "deferred"


#: Longest a send sleeps for its slot before it is deferred instead, in milliseconds. It must
#: stay well inside a delivery claim's margin: the pipeline paces before it checks the lease.
MAX_SLEEP_MS = 1_000

#: A wait no caller outlives, in milliseconds (a century): "reserve whatever the wait".
FOREVER_MS = 100 * 366 * 86_400_000.0

# KEYS: the TAT key, the throttled counter hash. ARGV: now ms, interval ms, burst, longest wait ms
# to reserve, counter field for a wait, counter field for a deferral.
# Returns {reserved (0/1), wait in ms as text}: Lua numbers would lose their fraction on the way out.
_ACQUIRE = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local new_tat = tat + interval
local wait = new_tat - burst * interval - now
if wait > tonumber(ARGV[4]) then
  redis.call('HINCRBY', KEYS[2], ARGV[6], 1)
  return {0, tostring(wait)}
end
redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', math.ceil(new_tat - now) + 1000)
if wait > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[5], 1)
  return {1, tostring(wait)}
end
return {1, '0'}
"""


def send_rate_key(namespace: str) -> str:
    """The Redis key of the fleet's send schedule."""
    return f"{namespace}:send_rate"


@dataclass(frozen=True)
class Permit:
    #: Milliseconds until this send may go: 0 means now.
    wait_ms: float
    #: Whether the slot at ``wait_ms`` is this caller's (it waits), or nobody's (it is deferred).
    reserved: bool


class SendRate:
    """The fleet's send schedule: at most ``per_second`` sends a second, ``burst`` at once.

    :param per_second: the rate, in sends per second (more than 0).
    :param burst: sends admitted back to back after an idle spell (at least 1).
    """

    def __init__(self, client: redis.Redis, *, namespace: str, per_second: float, burst: int = 1) -> None:
        if not per_second > 0 or burst < 1:
            raise ValueError(f"A send rate needs a rate above 0 and a burst of at least 1, got {per_second}, {burst}.")
        self.client = client
        self.namespace = namespace
        self.interval_ms = 1000.0 / per_second
        self.burst = burst
        self._keys = [send_rate_key(namespace), counters.counter_key(namespace, THROTTLED_COUNTER)]
        self._acquire = client.register_script(_ACQUIRE)

    def acquire(self, now_ms: float, *, max_wait_ms: float = FOREVER_MS) -> Permit:
        """Ask for a slot at ``now_ms`` (epoch milliseconds), in one atomic call.

        :param max_wait_ms: longest wait this caller reserves a slot for (it will wait that
            long); a longer wait is only reported, and the caller defers. Default: any wait.
        """
        reserved, wait_ms = cast(
            list[bytes],
            self._acquire(
                keys=self._keys,
                args=[
                    f"{now_ms:.3f}",
                    repr(self.interval_ms),
                    self.burst,
                    f"{max_wait_ms:.3f}",
                    ThrottleOutcome.WAITED,
                    ThrottleOutcome.DEFERRED,
                ],
            ),
        )
        return Permit(wait_ms=max(float(wait_ms), 0.0), reserved=bool(int(reserved)))


def pace(
    limiter: SendRate | None, now_ms: float, *, max_sleep_ms: float = MAX_SLEEP_MS, sleep: Callable[[float], None]
) -> Outcome | None:
    """Hold this send to the fleet's rate: return when it may go, after sleeping for its slot if
    that is at most ``max_sleep_ms`` away, or return the deferral (which spends no retry) when it
    is further. ``None`` (no ``SEND_RATE_PER_SECOND``) returns at once.

    :param sleep: takes seconds (``time.sleep``).
    """
    if limiter is None:
        return None
    permit = limiter.acquire(now_ms, max_wait_ms=max_sleep_ms)
    if not permit.reserved:
        return Outcome.deferred(permit.wait_ms / 1000, "send rate reached")
    if permit.wait_ms > 0:
        sleep(permit.wait_ms / 1000)
    return None


def build(client: redis.Redis, *, namespace: str, per_second: float | None, burst: int) -> SendRate | None:
    """The fleet's limiter from the settings' values, or ``None`` when no rate is set."""
    if per_second is None:
        return None
    return SendRate(client, namespace=namespace, per_second=per_second, burst=burst)
