"""A fleet-wide send rate: a GCRA limiter in Redis, shared by every worker on every machine.

Every send asks :meth:`SendRate.acquire` first; one Lua script decides, so the fleet agrees without
a lock. A caller that will wait books its slot in the same call; one whose wait is longer than it
will sleep books nothing and is deferred (docs/explanation/failures.md, "The send rate is
fleet-wide"). The rate follows the provider's pace (:mod:`reports.delivery.aimd`, and
docs/howto/throughput.md). Times are milliseconds passed in by the caller.

With no ceiling, a process that has just read "no cut" from Redis trusts that reading for
``reading_ms`` and lets its sends go without asking, counting them to report with its next call:
what that costs and promises, docs/explanation/failures.md.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import redis
from redis.typing import EncodableT, FieldT

from reports import counters
from reports.delivery import aimd
from reports.delivery.reading import LastReading
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

#: Shortest and longest spacing of the probes after a cut, in milliseconds.
PROBE_MIN_MS = 100
PROBE_MAX_MS = 5_000
#: What the spacing of the probes is of the time since the cut: an eighth.
PROBE_FRACTION = 8

#: A cut rate with no further cut for this long is forgotten, in milliseconds: the provider may
#: have lifted its limit, and the ceiling (or no limit) is tried again.
FORGET_AFTER_MS = 600_000

#: A wait no caller outlives, in milliseconds (a century): "reserve whatever the wait".
FOREVER_MS = 100 * 366 * 86_400_000.0

#: Refusals about the pace one email may take: past them, its refusals are about that email (a
#: recipient's own policy answering 4.7.x, say), not the fleet's pace. A pace the provider keeps
#: for the whole fleet refuses whichever emails come, and its cut spaces the sends so that one
#: email is rarely refused that often; a refusal that follows one email alone, while others go
#: out, would otherwise cut the fleet's rate every time that email came back.
PACE_REFUSALS_PER_EMAIL = 5
#: How long an email's refusals about the pace are remembered, in seconds.
PACE_REFUSALS_KEPT_SECONDS = 3_600

#: With no ceiling, how long a process trusts a reading of "no cut" before it asks Redis again, in
#: milliseconds. Bounds how late another process's cut is followed, as the breaker's state cache does.
READING_MS = 250

# KEYS: the TAT key, the throttled counter hash, the adjusted rate's hash, the observed rate's hash.
# ARGV: now ms, the ceiling's interval ms (0: none), burst, longest wait ms to reserve, counter
# field for a wait, counter field for a deferral, shortest and longest probe spacing ms, the
# probe spacing's fraction of the time since the cut, sends admitted without asking since this
# process last asked (counted as sent before this one).
# Returns {reserved (0/1), wait in ms as text, adapting (0/1)}: Lua numbers would lose their
# fraction on the way out.
_ACQUIRE = """
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local adapted = redis.call('HMGET', KEYS[3], 'per_second', 'fresh', 'cut_ms')
if adapted[1] then
  interval = math.max(interval, 1000 / tonumber(adapted[1]))
  if adapted[2] == '0' then
    local since_cut = (now - tonumber(adapted[3])) / tonumber(ARGV[9])
    interval = math.max(interval, tonumber(ARGV[7]), math.min(tonumber(ARGV[8]), since_cut))
    burst = 1
  end
end
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local new_tat = tat + interval
local wait = new_tat - burst * interval - now
local adapting = adapted[1] and 1 or 0
if wait > tonumber(ARGV[4]) then
  redis.call('HINCRBY', KEYS[2], ARGV[6], 1)
  return {0, tostring(wait), adapting}
end
redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', math.ceil(new_tat - now) + 1000)
local earlier = tonumber(ARGV[10])
local seen = redis.call('HMGET', KEYS[4], 'since_ms', 'sends')
local since = tonumber(seen[1] or '0')
if since == 0 then
  redis.call('HSET', KEYS[4], 'since_ms', string.format('%.3f', now), 'sends', 1 + earlier)
  redis.call('PEXPIRE', KEYS[4], 60000)
elseif now - since >= 1000 then
  local per_second = (tonumber(seen[2]) + earlier) * 1000 / (now - since)
  redis.call('HSET', KEYS[4], 'since_ms', string.format('%.3f', now), 'sends', 1, 'per_second', tostring(per_second))
  redis.call('PEXPIRE', KEYS[4], 60000)
else
  redis.call('HINCRBY', KEYS[4], 'sends', 1 + earlier)
end
if wait > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[5], 1)
  return {1, tostring(wait), adapting}
end
return {1, '0', adapting}
"""


def send_rate_key(namespace: str) -> str:
    """The Redis key of the fleet's send schedule."""
    return f"{namespace}:send_rate"


def adapted_rate_key(namespace: str) -> str:
    """The Redis key of the rate the fleet follows the provider with (absent: the ceiling)."""
    return f"{namespace}:send_rate:adapted"


@dataclass(frozen=True)
class Slot:
    #: Milliseconds until this send may go: 0 means now.
    wait_ms: float
    #: Whether the slot at ``wait_ms`` is this caller's (it waits), or nobody's (it is deferred).
    reserved: bool
    #: Whether the rate is following the provider (below the ceiling): a success is then reported.
    adapting: bool = False
    #: When the slot was asked for, in epoch milliseconds.
    at_ms: float = field(default=0.0, compare=False)


class SendRate:
    """The fleet's send schedule: at most ``per_second`` sends a second, ``burst`` at once, and
    less while the provider asks for less.

    :param per_second: the ceiling, in sends per second (more than 0); ``None``: none but the provider's.
    :param burst: sends admitted back to back after an idle spell (at least 1).
    :param reading_ms: with no ceiling, how long a reading of "no cut" is trusted (:data:`READING_MS`;
        0: never, every send asks Redis).
    :param clock: seconds from an arbitrary start, for the reading's age (``time.monotonic``).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        namespace: str,
        per_second: float | None,
        burst: int = 1,
        reading_ms: int = READING_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (per_second is not None and not per_second > 0) or burst < 1:
            raise ValueError(f"A send rate needs a rate above 0 and a burst of at least 1, got {per_second}, {burst}.")
        self.client = client
        self.namespace = namespace
        self.ceiling = per_second
        self.interval_ms = 0.0 if per_second is None else 1000.0 / per_second
        self.burst = burst
        self._adapted_key = adapted_rate_key(namespace)
        self._observed_key = f"{namespace}:send_rate:observed"
        self._keys = [
            send_rate_key(namespace),
            counters.counter_key(namespace, THROTTLED_COUNTER),
            self._adapted_key,
            self._observed_key,
        ]
        self._acquire = client.register_script(_ACQUIRE)
        # Whether the fleet follows no cut. A ceiling spaces every send, which only the schedule in
        # Redis can do: then no reading is trusted.
        self._uncut: LastReading[bool] = LastReading(reading_ms if per_second is None else 0, clock)
        self._unasked = 0  # sends let go on the reading since this process last asked
        self._unasked_lock = threading.Lock()

    def acquire(self, now_ms: float, *, max_wait_ms: float = FOREVER_MS) -> Slot:
        """Ask for a slot at ``now_ms`` (epoch milliseconds): at once while this process's reading
        of "no cut" is fresh, otherwise in one atomic call.

        :param max_wait_ms: longest wait this caller reserves a slot for (it will wait that
            long); a longer wait is only reported, and the caller defers. Default: any wait.
        """
        with self._unasked_lock:
            if self._uncut.fresh():
                self._unasked += 1
                return Slot(wait_ms=0.0, reserved=True, at_ms=now_ms)
            unasked, self._unasked = self._unasked, 0
        asked_at = self._uncut.clock()
        reserved, wait_ms, adapting = cast(
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
                    PROBE_MIN_MS,
                    PROBE_MAX_MS,
                    PROBE_FRACTION,
                    unasked,
                ],
            ),
        )
        self._uncut.remember(not int(adapting), asked_at)
        return Slot(
            wait_ms=max(float(wait_ms), 0.0),
            reserved=bool(int(reserved)),
            adapting=bool(int(adapting)),
            at_ms=now_ms,
        )

    def adapted(self) -> aimd.Adapted | None:
        """The rate the fleet follows the provider with, or ``None`` while it is at the ceiling."""
        return _decode(cast(dict[bytes, bytes], self.client.hgetall(self._adapted_key)))

    def slow_down(self, now_ms: float) -> aimd.Adapted | None:
        """The provider refused a send for the pace: cut the fleet's rate, unless the cut for this
        overload is made already. Returns the new rate, or ``None`` when it was left as it was."""

        made: list[aimd.Adapted | None] = [None]
        unasked = self._unasked

        def cut(pipe: redis.client.Pipeline) -> None:
            state = _decode(cast(dict[bytes, bytes], pipe.hgetall(self._adapted_key)))
            seen = cast(dict[bytes, bytes], pipe.hgetall(self._observed_key))
            observed = _observed(seen, now_ms, unasked=unasked)
            after = aimd.after_refusal(state, now_ms=now_ms, observed_per_second=observed, ceiling=self.ceiling)
            if after is not None:
                pipe.multi()
                pipe.hset(self._adapted_key, mapping=_encode(after))
                pipe.pexpire(self._adapted_key, FORGET_AFTER_MS)
            made[0] = after

        self.client.transaction(cut, self._adapted_key)
        # The fleet follows a cut now (this one, or the one made already): this process's next
        # send asks Redis. Read after the commit, so no answer read before it can replace this.
        self._uncut.remember(False, self._uncut.clock())
        return made[0]

    def refused_for_pace(self, email: str) -> int:
        """Count a refusal about the pace of ``email`` (a key naming one email, the same for
        every copy of its message); returns how many it has had lately, this one included."""
        key = f"{self.namespace}:send_rate:refused:{email}"
        with self.client.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, PACE_REFUSALS_KEPT_SECONDS)
            refusals, _expire = pipe.execute()
        return int(refusals)

    def sped(self, sent_at_ms: float) -> None:
        """The provider accepted a send admitted at ``sent_at_ms`` while the rate was adapting: raise it."""

        def rise(pipe: redis.client.Pipeline) -> None:
            state = _decode(cast(dict[bytes, bytes], pipe.hgetall(self._adapted_key)))
            if state is None:
                return
            after = aimd.after_success(state, sent_at_ms=sent_at_ms, ceiling=self.ceiling)
            pipe.multi()
            if after is None:
                pipe.delete(self._adapted_key)
            else:
                pipe.hset(self._adapted_key, mapping=_encode(after))  # keeps the key's expiry

        self.client.transaction(rise, self._adapted_key)


def _observed(seen: dict[bytes, bytes], now_ms: float, *, unasked: int) -> float | None:
    """Sends a second the fleet made lately: the last whole second's count, or within the first
    second the count so far (a provider may refuse before a second has passed), with this
    process's ``unasked`` sends that Redis has not counted yet."""
    if b"per_second" in seen:
        return float(seen[b"per_second"])
    if b"since_ms" not in seen:
        return None
    sends = int(seen[b"sends"]) + unasked
    return sends * 1000 / max(now_ms - float(seen[b"since_ms"]), OBSERVED_AT_LEAST_MS)


#: The shortest span a rate is read over, in milliseconds: a first send alone is not a rate.
OBSERVED_AT_LEAST_MS = 100.0


def _encode(state: aimd.Adapted) -> dict[FieldT, EncodableT]:
    return {
        "per_second": repr(state.per_second),
        "step": repr(state.step),
        "cut_ms": f"{state.cut_ms:.3f}",
        "fresh": "1" if state.fresh else "0",
        "successes": str(state.successes),
    }


def _decode(raw: dict[bytes, bytes]) -> aimd.Adapted | None:
    if b"per_second" not in raw:
        return None
    return aimd.Adapted(
        per_second=float(raw[b"per_second"]),
        step=float(raw[b"step"]),
        cut_ms=float(raw[b"cut_ms"]),
        fresh=raw[b"fresh"] == b"1",
        successes=int(raw[b"successes"]),
    )


def pace(
    limiter: SendRate | None,
    now_ms: float,
    *,
    max_sleep_ms: float = MAX_SLEEP_MS,
    patience_ms: float = 0.0,
    sleep: Callable[[float], None],
) -> Slot | Outcome | None:
    """Hold this send to the fleet's rate: return its slot when it may go, after sleeping for
    its slot if that is at most ``max_sleep_ms`` away, or the deferral (which spends no retry)
    when it is further. ``None`` (no limiter) returns ``None`` at once.

    :param patience_ms: how long this caller may wait in all before it is deferred: it sleeps
        until a slot may be within reach and asks again, as long as the slot's wait fits. A thread
        that waits for the rate does not take message after message only to defer each (a deferral
        costs a round trip through the queue, the claim's two transactions and a log line).
    :param sleep: takes seconds (``time.sleep``).
    """
    if limiter is None:
        return None
    waited_ms = 0.0
    while True:
        slot = limiter.acquire(now_ms + waited_ms, max_wait_ms=max_sleep_ms)
        if slot.reserved:
            break
        # The slot is past what may be booked: come back when it may be, if that is within patience.
        if waited_ms + slot.wait_ms > patience_ms:
            return Outcome.deferred(slot.wait_ms / 1000, "send rate reached")
        nap_ms = max(slot.wait_ms - max_sleep_ms, 1.0)
        sleep(nap_ms / 1000)
        waited_ms += nap_ms
    if slot.wait_ms > 0:
        sleep(slot.wait_ms / 1000)
    return slot


def build(
    client: redis.Redis, *, namespace: str, per_second: float | None, burst: int, follow_provider: bool = False
) -> SendRate | None:
    """The fleet's limiter from the settings' values, or ``None`` when no rate is set and there is
    no provider to follow (mail written to a Maildir has no pace to keep)."""
    if per_second is None and not follow_provider:
        return None
    return SendRate(client, namespace=namespace, per_second=per_second, burst=burst)
