"""A circuit breaker for the mail provider, shared by every worker on every machine through Redis.

closed ──(N provider failures within the window)──► open ──(cool-down ends)──► half-open
  ▲                                                   ▲                            │
  └──────────────── the probe succeeds ───────────────┴──── the probe fails ───────┘

Transitions happen in Lua scripts, so concurrent workers agree on the state; times are
milliseconds passed in by the caller. Each process trusts the state it last read for
``state_cache_ms``; what that costs and promises: docs/explanation/failures.md.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import redis

from reports.delivery.reading import LastReading

logger = logging.getLogger(__name__)


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


#: Numeric form for metrics: closed 0, half-open 1, open 2.
STATE_VALUES = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}


def mail_breaker_name(namespace: str) -> str:
    """The Redis name of the mail provider's breaker, shared by every process of a deployment."""
    return f"{namespace}:breaker:mail"


def state_of(client: redis.Redis, name: str) -> State:
    """The breaker's state as Redis holds it (an open breaker past its cool-down still reads open)."""
    raw = cast(bytes | None, client.hget(f"{name}:state", "state"))
    return State(raw.decode()) if raw else State.CLOSED


@dataclass(frozen=True)
class Reader:
    """The fleet's breaker ``name`` as a process that does not send reads it (reconcile)."""

    client: redis.Redis
    name: str
    #: Unix time, in seconds: the workers' clock, which wrote the cool-down's end.
    clock: Callable[[], float] = time.time

    def holds_back(self) -> bool:
        """Whether the breaker is holding sends back: open within its cool-down, or with a probe out.

        An open breaker past its cool-down holds nothing back: the next send would be its probe.
        Only a send moves it on, so with no message left to send (the broker lost them, or the
        month was cancelled meanwhile) it reads open for ever, and reconcile, waiting for it,
        would never send again what was lost.
        """
        state, until = cast(list[bytes | None], self.client.hmget(f"{self.name}:state", "state", "until"))
        if state is None or State(state.decode()) is State.CLOSED:
            return False
        return self.clock() * 1000 < int(until or 0)


#: How long a process trusts the breaker state it last read from Redis, in milliseconds.
#: Bounds how late another process's opening is seen; 0 asks Redis on every ``allow``.
STATE_CACHE_MS = 250

# The scripts also return the state's ``until`` (cool-down or probe lease end, in ms; 0 when
# closed), so one call refreshes a process's cache.

# KEYS: state hash. ARGV: now, probe lease, cool-down.
# Returns {allowed (0/1), wait ms, state, changed (0/1), until}.
# While the probe is out, the others wait at most a cool-down, not the probe's whole lease (three
# send deadlines): a probe that succeeds in a second would otherwise hold them back far longer than
# the open breaker did.
_ALLOW = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local now = tonumber(ARGV[1])
if state == 'closed' then return {1, 0, state, 0, 0} end
local until_ms = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if now < until_ms then
  local wait_ms = until_ms - now
  if state == 'half_open' then wait_ms = math.min(wait_ms, tonumber(ARGV[3])) end
  return {0, wait_ms, state, 0, until_ms}
end
until_ms = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'half_open', 'until', until_ms)
return {1, 0, 'half_open', state == 'open' and 1 or 0, until_ms}
"""

# KEYS: state hash, failure zset. ARGV: now, window, threshold, cool-down, member.
# Returns {state after, changed (0/1), until, state before}.
_FAILURE = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local now = tonumber(ARGV[1])
-- A late failure from a send let through before the breaker opened: the cool-down stands.
if state == 'open' then
  return {state, 0, tonumber(redis.call('HGET', KEYS[1], 'until') or '0'), state}
end
if state == 'closed' then
  redis.call('ZADD', KEYS[2], now, ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
  if redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[3]) then return {state, 0, 0, state} end
end
local until_ms = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'state', 'open', 'until', until_ms)
redis.call('DEL', KEYS[2])
return {'open', 1, until_ms, state}
"""

# KEYS: state hash, failure zset. Returns the state before (the state after is closed).
_SUCCESS = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state ~= 'closed' then redis.call('DEL', KEYS[1], KEYS[2]) end
return state
"""

# KEYS: state hash. ARGV: the end of the probe's slot, now. Returns 1 when the slot was given back.
# Only the slot this probe was handed: one that ran out and went to another probe is left alone.
_GIVE_BACK = """
if redis.call('HGET', KEYS[1], 'state') ~= 'half_open' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'until') or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'until', ARGV[2])
return 1
"""


@dataclass(frozen=True)
class Permit:
    allowed: bool
    #: When not allowed: how long until the breaker may let a call through, in milliseconds.
    wait_ms: int
    #: True when this caller is the half-open probe.
    probe: bool
    #: The probe's slot: when it ends, in milliseconds (0 for any other permit). Names the slot
    #: to :meth:`CircuitBreaker.give_back`.
    slot_ends_ms: int = field(default=0, compare=False)


_GO = Permit(allowed=True, wait_ms=0, probe=False)


class CircuitBreaker:
    """The breaker ``name`` in Redis, as one process sees it.

    :param failure_threshold: provider failures within ``window_ms`` that open it.
    :param cooldown_ms: how long it stays open before one probe is let through.
    :param probe_timeout_ms: how long the probe holds its slot if it never reports back.
    :param state_cache_ms: how long a state read from Redis is trusted (:data:`STATE_CACHE_MS`;
        0: never). See the module docstring for what this does to the breaker's promise.
    :param clock: seconds from an arbitrary start, for the cache's age (``time.monotonic``).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        name: str,
        failure_threshold: int,
        window_ms: int,
        cooldown_ms: int,
        probe_timeout_ms: int,
        state_cache_ms: int = STATE_CACHE_MS,
        on_change: Callable[[State, State], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.name = name
        self.failure_threshold = failure_threshold
        self.window_ms = window_ms
        self.cooldown_ms = cooldown_ms
        self.probe_timeout_ms = probe_timeout_ms
        self.state_cache_ms = state_cache_ms
        self._on_change = on_change
        self._clock = clock
        self._state_key = f"{name}:state"
        self._failures_key = f"{name}:failures"
        self._allow = client.register_script(_ALLOW)
        self._failure = client.register_script(_FAILURE)
        self._success = client.register_script(_SUCCESS)
        self._give_back = client.register_script(_GIVE_BACK)
        # The state as a script last answered it, and its ``until_ms``.
        self._reading: LastReading[tuple[State, int]] = LastReading(state_cache_ms, clock)
        self._asking = threading.Lock()

    def state(self) -> State:
        """The state as Redis holds it now (never cached)."""
        return state_of(self.client, self.name)

    def allow(self, now_ms: int) -> Permit:
        cached = self._cached_permit(now_ms)
        if cached is not None:
            return cached
        if self.state_cache_ms <= 0:
            return self._ask(now_ms)
        # When the reading goes stale, one thread asks and the others take its answer, rather
        # than every worker thread of the process asking at once.
        with self._asking:
            cached = self._cached_permit(now_ms)
            return cached if cached is not None else self._ask(now_ms)

    def _ask(self, now_ms: int) -> Permit:
        asked_at = self._clock()
        allowed, wait_ms, state, changed, until_ms = self._allow(
            keys=[self._state_key], args=[now_ms, self.probe_timeout_ms, self.cooldown_ms]
        )
        after = State(state.decode())
        self._reading.remember((after, int(until_ms)), asked_at)
        if changed:
            self._log(State.OPEN, State.HALF_OPEN)
        probe = bool(allowed) and after is State.HALF_OPEN
        return Permit(
            allowed=bool(allowed), wait_ms=int(wait_ms), probe=probe, slot_ends_ms=int(until_ms) if probe else 0
        )

    def record_failure(self, now_ms: int, *, token: str) -> State:
        """Count a provider failure; returns the state after (``OPEN`` means: do not retry now)."""
        asked_at = self._clock()
        state, changed, until_ms, before = self._failure(
            keys=[self._state_key, self._failures_key],
            args=[now_ms, self.window_ms, self.failure_threshold, self.cooldown_ms, token],
        )
        after = State(state.decode())
        self._reading.remember((after, int(until_ms)), asked_at)
        if changed:
            self._log(State(before.decode()), after)
        return after

    def record_success(self) -> None:
        asked_at = self._clock()
        before = State(self._success(keys=[self._state_key, self._failures_key]).decode())
        self._reading.remember((State.CLOSED, 0), asked_at)
        if before is not State.CLOSED:
            self._log(before, State.CLOSED)

    def give_back(self, permit: Permit, now_ms: int) -> None:
        """Hand back a probe that will not send after all: the next caller becomes the probe, rather
        than every caller waiting for the slot to run out (the probe timeout)."""
        if permit.probe:
            self._give_back(keys=[self._state_key], args=[permit.slot_ends_ms, now_ms])

    def _cached_permit(self, now_ms: int) -> Permit | None:
        """The answer the last reading gives without Redis: go while closed, wait while open."""
        reading = self._reading.fresh()
        if reading is None:
            return None
        state, until_ms = reading
        if state is State.CLOSED:
            return _GO
        if state is State.OPEN and now_ms < until_ms:
            return Permit(allowed=False, wait_ms=until_ms - now_ms, probe=False)
        # Half-open, or a cool-down that has passed: only the script may hand out the probe.
        return None

    def _log(self, before: State, after: State) -> None:
        logger.warning(
            "Circuit breaker %s: %s -> %s.",
            self.name,
            before,
            after,
            extra={"breaker": self.name, "from_state": str(before), "to_state": str(after)},
        )
        if self._on_change is not None:
            self._on_change(before, after)
